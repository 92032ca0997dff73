//! A local file handed from the page to the worker through shared memory, on a page that may
//! share it (cross-origin isolated: `collector serve` sends the headers for it).
//!
//! Reading a file costs the thread that reads it: its bytes come from the browser's process
//! through a pipe that the reading thread drains, so a worker that reads its file in slices
//! (`FileReaderSync`) stops parsing for every slice, and a read it starts before parsing
//! (`Blob.arrayBuffer()`) waits for the parse to end. Here the page's thread, idle while the
//! worker imports, reads the file (`Blob.stream()`) into a ring buffer (a
//! `SharedArrayBuffer`) and the worker takes what has arrived as it parses: on the 57.5 MB
//! snapshot of `docs/benchmarks.md` the worker waited 23 ms for bytes instead of reading for
//! 99, and its first screen came at 293–306 ms against 304–335 (the page's reading slows the
//! worker beside it on two cores, by less than it saves).
//!
//! The ring's control words (an `Int32Array` on a `SharedArrayBuffer`): bytes written by the
//! page and taken by the worker (each the low 32 bits of its count: the two never differ by
//! more than the ring's size), the state (reading, ended, failed, stopped by the worker), and
//! a sequence number the page bumps at each change, which the worker waits on (so that a state
//! changed between its look and its wait still wakes it).

use js_sys::{Atomics, Int32Array, SharedArrayBuffer, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};

/// Bytes of the ring. The worker parses more slowly than the page reads, so the page mostly
/// waits for room; a larger ring would only hold more of the file ahead.
pub const RING_BYTES: u32 = 8 << 20;

/// Bytes the worker takes at most at once (from what has arrived).
pub const TAKE_BYTES: usize = 1 << 20;

const WRITTEN: u32 = 0;
const TAKEN: u32 = 1;
const STATE: u32 = 2;
const SEQUENCE: u32 = 3;
const CONTROL_WORDS: u32 = 4;

const READING: i32 = 0;
const ENDED: i32 = 1;
const FAILED: i32 = 2;
const STOPPED: i32 = 3;

/// The shared memory a file goes through: posted to the worker with the file.
#[derive(Clone, Debug)]
pub struct Ring {
    pub data: SharedArrayBuffer,
    pub control: Int32Array,
}

/// Whether this page may share memory with its worker (`crossOriginIsolated`).
pub fn shared_memory_available() -> bool {
    js_sys::Reflect::get(&js_sys::global(), &JsValue::from_str("crossOriginIsolated")).is_ok_and(|v| v.is_truthy())
}

impl Ring {
    /// A ring for a file of `size` bytes (no larger than the file), when the page may share
    /// memory with its worker.
    pub fn for_file(size: f64) -> Option<Ring> {
        if !shared_memory_available() {
            return None;
        }
        let bytes = size.clamp(1.0, f64::from(RING_BYTES)) as u32;
        Some(Ring { data: SharedArrayBuffer::new(bytes), control: Int32Array::new(&SharedArrayBuffer::new(CONTROL_WORDS * 4)) })
    }

    /// The ring in a message's fields, when they are one: shared buffers of a plausible size.
    pub fn from_parts(data: JsValue, control: JsValue) -> Option<Ring> {
        let data: SharedArrayBuffer = data.dyn_into().ok()?;
        let control: Int32Array = control.dyn_into().ok()?;
        let shared = control.buffer().is_instance_of::<SharedArrayBuffer>();
        (shared && control.length() >= CONTROL_WORDS && data.byte_length() >= 1).then_some(Ring { data, control })
    }

    fn load(&self, word: u32) -> i32 {
        Atomics::load(&self.control, word).unwrap_or(FAILED)
    }

    fn store(&self, word: u32, value: i32) {
        let _ = Atomics::store(&self.control, word, value);
    }

    /// Moves the state from reading to `state` (an end already said stays), and wakes both
    /// sides: the worker waiting for bytes, the page waiting for room.
    fn end(&self, state: i32) {
        let _ = Atomics::compare_exchange(&self.control, STATE, READING, state);
        self.changed();
        let _ = Atomics::notify(&self.control, TAKEN);
    }

    /// Wakes the worker: something it may wait for changed.
    fn changed(&self) {
        let _ = Atomics::add(&self.control, SEQUENCE, 1);
        let _ = Atomics::notify(&self.control, SEQUENCE);
    }
}

/// The page's side: reads `file` into `ring` as the worker takes it, until the file ends, the
/// browser fails to read it, or the worker stops taking (it failed, or opened another file).
pub async fn fill(ring: Ring, file: web_sys::File) {
    let state = match fill_until_end(&ring, &file).await {
        Ok(()) => ENDED,
        Err(_) => FAILED,
    };
    ring.end(state);
}

async fn fill_until_end(ring: &Ring, file: &web_sys::File) -> Result<(), JsValue> {
    let reader: web_sys::ReadableStreamDefaultReader = file.stream().get_reader().unchecked_into();
    let view = Uint8Array::new(&ring.data);
    let capacity = u64::from(view.length());
    let mut written: u64 = 0;
    loop {
        let chunk = wasm_bindgen_futures::JsFuture::from(reader.read()).await?;
        if js_sys::Reflect::get(&chunk, &JsValue::from_str("done"))?.is_truthy() {
            return Ok(());
        }
        let value: Uint8Array = js_sys::Reflect::get(&chunk, &JsValue::from_str("value"))?.dyn_into()?;
        let (mut at, len) = (0u32, value.length());
        while at < len {
            if ring.load(STATE) == STOPPED {
                let _ = reader.cancel();
                return Ok(());
            }
            let taken = ring.load(TAKEN);
            let free = capacity - u64::from((written as u32).wrapping_sub(taken as u32));
            if free == 0 {
                // Until the worker takes some; now and then to look at the state again.
                wait_for_change(ring, TAKEN, taken, 50.0).await;
                continue;
            }
            let start = written % capacity;
            let n = free.min(u64::from(len - at)).min(capacity - start) as u32;
            view.set(&value.subarray(at, at + n), start as u32);
            written += u64::from(n);
            at += n;
            ring.store(WRITTEN, written as u32 as i32);
            ring.changed();
        }
    }
}

/// Waits (without blocking the page) until `word` is no longer `was`, or `timeout_ms` passed.
async fn wait_for_change(ring: &Ring, word: u32, was: i32, timeout_ms: f64) {
    let waiting = Atomics::wait_async_with_timeout(&ring.control, word, was, timeout_ms)
        .ok()
        .filter(|w| js_sys::Reflect::get(w, &JsValue::from_str("async")).is_ok_and(|a| a.is_truthy()))
        .and_then(|w| js_sys::Reflect::get(&w, &JsValue::from_str("value")).ok());
    match waiting {
        Some(promise) => {
            let _ = wasm_bindgen_futures::JsFuture::from(js_sys::Promise::from(promise)).await;
        }
        // Changed already, or a browser without `Atomics.waitAsync`: look again soon.
        None if Atomics::load(&ring.control, word).is_ok_and(|now| now != was) => {}
        None => sleep_ms(1).await,
    }
}

async fn sleep_ms(ms: i32) {
    let promise = js_sys::Promise::new(&mut |resolve, _| {
        if let Some(w) = web_sys::window() {
            let _ = w.set_timeout_with_callback_and_timeout_and_arguments_0(&resolve, ms);
        }
    });
    let _ = wasm_bindgen_futures::JsFuture::from(promise).await;
}

/// The worker's side: the bytes the page writes, in order. Dropping it tells the page to stop.
pub struct RingReader {
    ring: Ring,
    capacity: u64,
    taken: u64,
}

impl RingReader {
    pub fn new(ring: Ring) -> RingReader {
        let capacity = u64::from(ring.data.byte_length());
        RingReader { ring, capacity, taken: 0 }
    }

    /// Takes up to `max` bytes of what has arrived into `into` (replacing what it held),
    /// waiting until some has; 0 at the file's end.
    pub fn take(&mut self, into: &mut Vec<u8>, max: usize) -> std::io::Result<usize> {
        loop {
            let sequence = self.ring.load(SEQUENCE);
            let written = self.ring.load(WRITTEN) as u32;
            let ready = u64::from(written.wrapping_sub(self.taken as u32));
            if ready > 0 {
                let start = self.taken % self.capacity;
                let n = ready.min(self.capacity - start).min(max as u64) as usize;
                into.resize(n, 0);
                Uint8Array::new_with_byte_offset_and_length(&self.ring.data, start as u32, n as u32).copy_to(into);
                self.taken += n as u64;
                self.ring.store(TAKEN, self.taken as u32 as i32);
                let _ = Atomics::notify(&self.ring.control, TAKEN);
                return Ok(n);
            }
            match self.ring.load(STATE) {
                // The page writes its last bytes before it says the file ended.
                ENDED if self.ring.load(WRITTEN) as u32 == written => {
                    into.clear();
                    return Ok(0);
                }
                FAILED => return Err(std::io::Error::other("the browser could not read the file")),
                _ => {}
            }
            if Atomics::wait_with_timeout(&self.ring.control, SEQUENCE, sequence, 10_000.0).is_err() {
                return Err(std::io::Error::other("this browser cannot wait for the page's reads"));
            }
        }
    }
}

impl Drop for RingReader {
    fn drop(&mut self) {
        self.ring.end(STOPPED);
    }
}
