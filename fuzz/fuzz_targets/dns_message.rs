//! The DNS forwarder's view of a message from an application or an upstream server
//! (`remora::dns::message`): header fields, and the SERVFAIL built for a query, which must be
//! a well-formed answer to that query.
#![no_main]

use libfuzzer_sys::fuzz_target;
use remora::fuzzing::dns::{answers, id, is_query, is_truncated, servfail, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    let _ = is_truncated(data);
    if let Some(id) = id(data) {
        let _ = answers(data, id);
    }
    if is_query(data) {
        let reply = servfail(data);
        assert!(reply.len() >= HEADER_LEN && reply.len() <= data.len());
        let query_id = id(data).expect("a query has an id");
        assert!(
            answers(&reply, query_id),
            "the SERVFAIL does not answer its query"
        );
        assert!(!is_query(&reply));
        assert!(!is_truncated(&reply));
        // The question it echoes is the query's own.
        assert_eq!(reply[HEADER_LEN..], data[HEADER_LEN..reply.len()]);
    }
});
