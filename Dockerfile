# One image for everything Remora runs in a cluster: the capture init container
# (`remora capture`), the proxy (`remora run`, with `remora wait` / `remora drain` for its
# lifecycle hooks) and the injection webhook (`remora webhook`).
#
#   docker build -t remora:dev .
#
# The entrypoint is the binary, so a container's args start with the subcommand, as the
# injector writes them (`args: [capture, -p, "15001", ...]`, `args: [run]`).

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p remora \
 && install -m 0755 target/release/remora /remora

FROM debian:bookworm-slim
# `remora capture` drives iptables-restore/ip6tables-restore (legacy or nft, detected at run
# time, as istio-iptables does), nft for --native-nftables, and ip for TPROXY routes, like
# Istio's proxy image. Debian's iptables package carries both the nft and legacy variants.
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables iproute2 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /remora /usr/local/bin/remora
# The proxy's uid and gid, which the capture rules let through. The init container overrides
# this with runAsUser 0 (the injector sets it).
USER 1337:1337
ENTRYPOINT ["/usr/local/bin/remora"]
CMD ["run"]
