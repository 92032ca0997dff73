//! The pickle's bytes, read through a window that grows only to the longest argument.

use crate::import::ImportError;
use std::io::Read;

/// Longest string, bytes or integer argument read: the window holds one whole, and no plain
/// data a snapshot holds comes near it.
pub(super) const MAX_ARGUMENT_BYTES: usize = 64 << 20;
/// What is kept of a longer unicode string.
pub(super) const CUT_STRING_KEEPS: usize = 64 << 10;

/// The input, read through a window that grows only to the longest argument.
pub(super) struct Input<R> {
    src: R,
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    /// Offset in the input of `buf[start]`.
    pub(super) offset: u64,
    eof: bool,
}

impl<R: Read> Input<R> {
    pub(super) fn new(src: R) -> Self {
        Input { src, buf: vec![0; 64 << 10], start: 0, end: 0, offset: 0, eof: false }
    }

    pub(super) fn pos(&self) -> usize {
        usize::try_from(self.offset).unwrap_or(usize::MAX)
    }

    pub(super) fn err(&self, at: usize, reason: impl Into<String>) -> ImportError {
        ImportError::Pickle { offset: at, reason: reason.into() }
    }

    /// Reads until at least `n` bytes are buffered or the input ends; returns what is buffered.
    pub(super) fn fill(&mut self, n: usize) -> Result<usize, ImportError> {
        while self.end - self.start < n && !self.eof {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.end == self.buf.len() {
                // Grows with the data that arrives, never to a length the input only claims.
                let len = self.buf.len().saturating_mul(2);
                self.buf.resize(len, 0);
            }
            match self.src.read(&mut self.buf[self.end..]) {
                Ok(0) => self.eof = true,
                Ok(k) => self.end += k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ImportError::Read { reason: e.to_string() }),
            }
        }
        Ok(self.end - self.start)
    }

    #[inline]
    pub(super) fn advance(&mut self, n: usize) {
        self.start += n;
        self.offset += n as u64;
    }

    #[inline]
    pub(super) fn opcode(&mut self) -> Result<Option<u8>, ImportError> {
        if self.start == self.end && self.fill(1)? == 0 {
            return Ok(None);
        }
        let b = self.buf[self.start];
        self.advance(1);
        Ok(Some(b))
    }

    #[inline]
    pub(super) fn take(&mut self, n: usize, what: &str) -> Result<&[u8], ImportError> {
        if self.end - self.start >= n {
            let s = self.start;
            self.advance(n);
            return Ok(&self.buf[s..s + n]);
        }
        let have = self.fill(n)?;
        if have < n {
            return Err(self.err(self.pos(), format!("truncated: {what} needs {n} bytes but only {have} remain")));
        }
        let s = self.start;
        self.advance(n);
        Ok(&self.buf[s..s + n])
    }

    #[inline]
    pub(super) fn u8(&mut self) -> Result<u8, ImportError> {
        Ok(self.take(1, "an opcode argument")?[0])
    }

    #[inline]
    pub(super) fn u16(&mut self) -> Result<u16, ImportError> {
        let b = self.take(2, "a 2-byte argument")?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    #[inline]
    pub(super) fn u32(&mut self) -> Result<u32, ImportError> {
        let b = self.take(4, "a 4-byte argument")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    pub(super) fn u64(&mut self) -> Result<u64, ImportError> {
        let b = self.take(8, "an 8-byte argument")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// A length argument as a `usize`; its bytes are checked when they are read.
    pub(super) fn len(&mut self, n: u64) -> Result<usize, ImportError> {
        if n > MAX_ARGUMENT_BYTES as u64 {
            return Err(self.err(
                self.pos(),
                format!(
                    "a string or number of {n} bytes; expected at most {} MiB (the window holds one argument whole)",
                    MAX_ARGUMENT_BYTES >> 20
                ),
            ));
        }
        Ok(n as usize)
    }

    pub(super) fn line(&mut self) -> Result<&str, ImportError> {
        let at = self.pos();
        let mut searched = 0;
        let nl = loop {
            if let Some(i) = self.buf[self.start + searched..self.end].iter().position(|&b| b == b'\n') {
                break searched + i;
            }
            searched = self.end - self.start;
            if self.fill(searched + 1)? == searched {
                return Err(self.err(at, "truncated: a text argument has no terminating newline"));
            }
        };
        let s = self.start;
        self.advance(nl + 1);
        std::str::from_utf8(&self.buf[s..s + nl]).map_err(|_| self.err(at, "text argument is not UTF-8"))
    }

    /// Bytes left after the current position (read to the end, not kept).
    pub(super) fn remaining(&mut self) -> Result<u64, ImportError> {
        let mut n = (self.end - self.start) as u64;
        self.start = self.end;
        let mut scratch = [0u8; 8192];
        loop {
            match self.src.read(&mut scratch) {
                Ok(0) => return Ok(n),
                Ok(k) => n += k as u64,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ImportError::Read { reason: e.to_string() }),
            }
        }
    }
}
