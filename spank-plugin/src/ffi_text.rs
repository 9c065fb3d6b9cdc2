//! Text that crosses into C, and names of SPANK's error codes: the FFI layer's pure parts, kept
//! out of `spank.rs` so that they are unit-tested.

use std::fmt;

/// A byte string for C: interior NULs become '?' (only used for messages and paths that
/// came from C strings, which cannot hold NUL anyway).
pub fn c_bytes(s: &[u8]) -> Vec<u8> {
    s.iter().map(|&b| if b == 0 { b'?' } else { b }).collect()
}

/// Names of SPANK error codes (spank_err_t), for messages.
pub struct EspankName(pub u32);

impl fmt::Display for EspankName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = match self.0 {
            0 => "ESPANK_SUCCESS",
            3000 => "ESPANK_ERROR",
            3001 => "ESPANK_BAD_ARG",
            3002 => "ESPANK_NOT_TASK",
            3003 => "ESPANK_ENV_EXISTS",
            3004 => "ESPANK_ENV_NOEXIST",
            3005 => "ESPANK_NOSPACE",
            3006 => "ESPANK_NOT_REMOTE",
            3007 => "ESPANK_NOEXIST",
            3008 => "ESPANK_NOT_EXECD",
            3009 => "ESPANK_NOT_AVAIL",
            3010 => "ESPANK_NOT_LOCAL",
            c => return write!(f, "spank error {c}"),
        };
        f.write_str(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_text() {
        assert_eq!(c_bytes(b"a\0b"), b"a?b");
        assert_eq!(EspankName(3004).to_string(), "ESPANK_ENV_NOEXIST");
        assert_eq!(EspankName(7).to_string(), "spank error 7");
    }
}
