use std::fmt;
use std::path::PathBuf;

/// Why a config was refused. Its `Display` reads `FILE:LINE:COLUMN: field `F`: message`.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read config", file.display())]
    Read {
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file was read but is not a valid config.
    #[error("{}", Located { file, line: *line, column: *column, field, message })]
    Invalid {
        file: PathBuf,
        /// 1-based line, when it can be told.
        line: Option<usize>,
        /// 1-based column, when it can be told.
        column: Option<usize>,
        /// Dotted path of the offending field (`inbound.port`); empty for the document itself.
        field: String,
        message: String,
    },
}

impl ConfigError {
    /// The line the error points at, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Invalid { line, .. } => *line,
        }
    }

    /// The dotted field path the error points at, if any.
    pub fn field(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Invalid { field, .. } => Some(field),
        }
    }
}

struct Located<'a> {
    file: &'a PathBuf,
    line: Option<usize>,
    column: Option<usize>,
    field: &'a str,
    message: &'a str,
}

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        if self.field.is_empty() {
            write!(f, ": {}", self.message)
        } else {
            write!(f, ": field `{}`: {}", self.field, self.message)
        }
    }
}
