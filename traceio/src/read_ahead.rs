//! Reading a file on a second thread while the importer parses what came before.
//!
//! Copying a file's bytes out of the page cache is a twelfth of a snapshot import natively
//! (`read` in a profile of `collector summary` on a 393 MB snapshot); on its own thread it
//! overlaps the parse. The thread fills a fixed pool of chunks (`POOL`) and the reader gives
//! each back once it is done with it, so memory stays a few chunks whatever the file's size
//! and no chunk is allocated, zeroed and faulted in twice (a new chunk per read cost a third of
//! the import's page faults).

use std::io::{self, Read};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

/// Bytes one read on the thread fills: small enough that a chunk is still in the processor's
/// cache when the reader copies it out.
const CHUNK_BYTES: usize = 1 << 20;
/// Chunks filled and not yet taken by the reader.
const IN_FLIGHT: usize = 4;
/// Chunks there ever are: those in flight, the one the reader reads, the one being filled.
const POOL: usize = IN_FLIGHT + 2;

/// A [`Read`] whose source is read on its own thread, [`CHUNK_BYTES`] ahead at a time.
///
/// Dropping it stops the thread once its read in progress returns (the source is dropped
/// there).
pub struct ReadAhead {
    full: Receiver<io::Result<Vec<u8>>>,
    empty: SyncSender<Vec<u8>>,
    chunk: Vec<u8>,
    at: usize,
    done: bool,
}

impl ReadAhead {
    pub fn new<R: Read + Send + 'static>(source: R) -> io::Result<ReadAhead> {
        let (full_tx, full) = sync_channel::<io::Result<Vec<u8>>>(IN_FLIGHT);
        let (empty, empty_rx) = sync_channel::<Vec<u8>>(POOL);
        std::thread::Builder::new().name("read-ahead".into()).spawn(move || fill(source, &full_tx, &empty_rx))?;
        Ok(ReadAhead { full, empty, chunk: Vec::new(), at: 0, done: false })
    }
}

/// The thread: fills chunks until the source ends or fails, or the reader is gone. It makes
/// [`POOL`] chunks at most and then waits for the reader to give one back.
fn fill<R: Read>(mut source: R, full: &SyncSender<io::Result<Vec<u8>>>, empty: &Receiver<Vec<u8>>) {
    let mut made = 0;
    loop {
        let mut buf = match empty.try_recv() {
            Ok(buf) => buf,
            Err(_) if made < POOL => {
                made += 1;
                vec![0; CHUNK_BYTES]
            }
            // Every chunk is made: wait for the reader to give one back (none comes once it
            // is gone).
            Err(_) => match empty.recv() {
                Ok(buf) => buf,
                Err(_) => return,
            },
        };
        // A chunk given back keeps its bytes: only a short last read left it shorter.
        buf.resize(CHUNK_BYTES, 0);
        let mut n = 0;
        let result = loop {
            match source.read(&mut buf[n..]) {
                Ok(0) => break Ok(()),
                Ok(k) => {
                    n += k;
                    if n == buf.len() {
                        break Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        buf.truncate(n);
        let end = n < CHUNK_BYTES;
        // An empty chunk is the end: send what was read first, then the error if any.
        if n > 0 && full.send(Ok(buf)).is_err() {
            return;
        }
        if let Err(e) = result {
            let _ = full.send(Err(e));
            return;
        }
        if end {
            let _ = full.send(Ok(Vec::new()));
            return;
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.at == self.chunk.len() {
            if self.done {
                return Ok(0);
            }
            let next = self.full.recv().map_err(|_| io::Error::other("the read-ahead thread stopped before the end of the input"))??;
            if next.is_empty() {
                self.done = true;
                return Ok(0);
            }
            let used = std::mem::replace(&mut self.chunk, next);
            // The thread fills it again (the channel holds the whole pool, so this never
            // waits; the first, empty chunk is not one of the pool's).
            if used.capacity() > 0 {
                let _ = self.empty.try_send(used);
            }
            self.at = 0;
        }
        let n = out.len().min(self.chunk.len() - self.at);
        out[..n].copy_from_slice(&self.chunk[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gives `step` bytes a read, then fails at `fail_at` if set.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
        fail_at: Option<usize>,
    }

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.fail_at.is_some_and(|f| self.at >= f) {
                return Err(io::Error::other("disk gone"));
            }
            let n = out.len().min(self.step).min(self.data.len() - self.at);
            out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Ok(n)
        }
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
    }

    #[test]
    fn the_bytes_arrive_whole_and_in_order() {
        for len in [0, 1, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES + 12_345] {
            for step in [1 << 16, 1_000_003] {
                let want = data(len);
                let mut got = Vec::new();
                ReadAhead::new(Trickle { data: want.clone(), at: 0, step, fail_at: None }).unwrap().read_to_end(&mut got).unwrap();
                assert!(got == want, "{len} bytes in reads of {step}: {} came", got.len());
            }
        }
    }

    #[test]
    fn an_error_arrives_after_the_bytes_before_it() {
        let want = data(2 * CHUNK_BYTES);
        let mut r = ReadAhead::new(Trickle { data: want.clone(), at: 0, step: 4096, fail_at: Some(CHUNK_BYTES + 4096) }).unwrap();
        let mut got = Vec::new();
        let e = r.read_to_end(&mut got).unwrap_err();
        assert_eq!(e.to_string(), "disk gone");
        assert!(got == want[..CHUNK_BYTES + 4096], "{} bytes before the error", got.len());
    }

    /// Counts what the thread has read, and says when the source is dropped.
    struct Counted(Trickle, std::sync::Arc<(std::sync::atomic::AtomicUsize, std::sync::atomic::AtomicBool)>);

    impl Read for Counted {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            let n = self.0.read(out)?;
            self.1 .0.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
            Ok(n)
        }
    }

    impl Drop for Counted {
        fn drop(&mut self) {
            self.1 .1.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn it_reads_a_few_chunks_ahead_and_stops_when_dropped() {
        use std::sync::atomic::Ordering::SeqCst;
        let seen = std::sync::Arc::new((std::sync::atomic::AtomicUsize::new(0), std::sync::atomic::AtomicBool::new(false)));
        let source = Counted(Trickle { data: data(16 * CHUNK_BYTES), at: 0, step: 1 << 20, fail_at: None }, seen.clone());
        let mut r = ReadAhead::new(source).unwrap();
        let mut head = [0u8; 10];
        r.read_exact(&mut head).unwrap();
        assert_eq!(head.to_vec(), data(10));
        // However long the reader waits, the thread holds a bounded number of chunks.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let ahead = seen.0.load(SeqCst);
        assert!(ahead <= POOL * CHUNK_BYTES, "{ahead} bytes read ahead");
        assert!(!seen.1.load(SeqCst));
        drop(r);
        let gone = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            seen.1.load(SeqCst)
        });
        assert!(gone, "the thread still holds the source 5 s after the reader was dropped");
        assert!(seen.0.load(SeqCst) < 16 * CHUNK_BYTES, "the thread read the whole source after the reader was dropped");
    }
}
