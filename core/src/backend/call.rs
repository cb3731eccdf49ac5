//! The public call of cudabuf a thread is in, for a backend's messages ([`current_call`]).
//!
//! cudabuf's public methods that reach the backend (copies, event records and waits,
//! stream creation, the releases made when a buffer is dropped) say which method they
//! are, where the user called them (`#[track_caller]`), and which device buffers they
//! name, for as long as they run on the calling thread. A backend that explains what it
//! saw (the simulator's race reports) speaks of that call instead of its own trait
//! method: `Stream::copy_from_slice` at `src/pipeline.rs:42:5`, bytes 0..64 of the
//! 256-byte buffer at `0x...`.
//!
//! The layers built on those methods (the buffered writer, the Arrow and Flight crates)
//! enter a call of their own public method first, so that the copies they make inside
//! are reported as the user's call of that method (`BufferWriter::write_all` at the
//! user's line, not a line inside cudabuf); a call made inside another one names the
//! outer call, and the device buffers of the inner one where the outer names none. Work
//! a call hands to helper threads (a file's threads, Flight's blocking steps) runs
//! inside that call there too.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::panic::Location;

use super::DevicePtr;

/// A call of cudabuf's public API, as the calling thread is making it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ApiCall {
    /// The public method, as a user writes it: `"Stream::copy_from_slice"`, or what
    /// happens for a drop: `"dropping a DeviceBuffer"`.
    pub method: &'static str,
    /// Where the user called it (`None` for a drop, which has no caller location).
    pub location: Option<&'static Location<'static>>,
    /// The device buffers the call names, as `(address, size)`: the destination first.
    pub buffers: [Option<(DevicePtr, usize)>; 2],
}

impl ApiCall {
    /// A call of `method` from the caller's caller (use in a `#[track_caller]` method).
    #[track_caller]
    pub(crate) fn here(method: &'static str) -> Self {
        Self::at(method, Location::caller())
    }

    /// A call of `method` made at `location`: for cudabuf's own crates, which enter their
    /// public methods' calls with [`enter_public`] (not part of the API).
    #[doc(hidden)]
    pub fn at(method: &'static str, location: &'static Location<'static>) -> Self {
        ApiCall {
            method,
            location: Some(location),
            buffers: [None; 2],
        }
    }

    /// Work cudabuf does with no caller location: a drop's release (`"dropping a
    /// DeviceBuffer"`), or a public call made elsewhere (a Flight server answering a
    /// request: `"a DeviceFlightServer answering DoGet"`); for cudabuf's own crates, not
    /// part of the API. Entered, it replaces the current call while it runs.
    #[doc(hidden)]
    pub fn named(method: &'static str) -> Self {
        ApiCall {
            method,
            location: None,
            buffers: [None; 2],
        }
    }

    /// The call, naming device buffer `(address, size)` (up to two: later ones ignored).
    pub(crate) fn with_buffer(mut self, address: DevicePtr, size: usize) -> Self {
        if let Some(slot) = self.buffers.iter_mut().find(|b| b.is_none()) {
            *slot = Some((address, size));
        }
        self
    }

    /// The buffer named by the call that holds `len` bytes at `address`, if any.
    pub fn buffer_holding(&self, address: DevicePtr, len: usize) -> Option<(DevicePtr, usize)> {
        self.buffers
            .iter()
            .flatten()
            .copied()
            .find(|&(base, size)| {
                address >= base && address.saturating_add(len as u64) <= base + size as u64
            })
    }
}

impl fmt::Display for ApiCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.location {
            Some(at) => write!(f, "`{}` at {at}", self.method),
            None => f.write_str(self.method),
        }
    }
}

thread_local! {
    static CURRENT: Cell<Option<ApiCall>> = const { Cell::new(None) };
}

/// The public call of cudabuf the calling thread is in: the outermost public method, or
/// the drop whose release is running.
pub fn current_call() -> Option<ApiCall> {
    CURRENT.with(Cell::get)
}

/// Marks the calling thread as inside `call` until the guard drops. A public call made
/// inside another one stays the outer one's (naming the inner one's device buffers
/// meanwhile if the outer names none); a release made by a drop (no location) replaces
/// it meanwhile (the free is the drop's, whatever call let go of the handle).
pub(crate) fn enter(call: ApiCall) -> CallGuard {
    CURRENT.with(|c| {
        let outer = c.get();
        let now = match outer {
            Some(outer) if call.location.is_some() => {
                if outer.buffers.iter().all(Option::is_none) && call.buffers[0].is_some() {
                    ApiCall {
                        buffers: call.buffers,
                        ..outer
                    }
                } else {
                    outer
                }
            }
            _ => call,
        };
        let changed = Some(now) != outer;
        if changed {
            c.set(Some(now));
        }
        CallGuard {
            restore: changed.then_some(outer),
            _this_thread: PhantomData,
        }
    })
}

/// Marks the calling thread as inside `call` (a call of one of cudabuf's public methods,
/// made with [`ApiCall::at`], or one taken with [`current_call`] on the thread that
/// started the work a helper thread does) until the guard drops, as cudabuf's own
/// methods do: the outermost call stays current. For cudabuf's own crates (the Arrow and
/// Flight layers), not part of the API.
#[doc(hidden)]
pub fn enter_public(call: ApiCall) -> CallGuard {
    enter(call)
}

/// Ends the call entered by [`enter_public`]: the outer one is current again. It restores
/// the calling thread's call, so it is neither `Send` nor `Sync` (a guard held across an
/// `.await` of a future that moves between threads does not compile).
#[doc(hidden)]
#[must_use]
pub struct CallGuard {
    restore: Option<Option<ApiCall>>,
    _this_thread: PhantomData<*const ()>,
}

impl fmt::Debug for CallGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallGuard").finish_non_exhaustive()
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        if let Some(outer) = self.restore {
            CURRENT.with(|c| c.set(outer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outermost_call_is_current_until_its_guard_drops() {
        assert_eq!(current_call(), None);
        let outer = ApiCall::here("Stream::copy_device").with_buffer(0x1000, 64);
        let g = enter(outer);
        {
            let _inner = enter(ApiCall::here("DeviceBuffer::to_vec"));
            assert_eq!(current_call(), Some(outer));
            let drop_call = ApiCall::named("dropping a DeviceBuffer");
            let dropping = enter(drop_call);
            assert_eq!(current_call(), Some(drop_call));
            drop(dropping);
            assert_eq!(current_call(), Some(outer));
        }
        assert_eq!(current_call(), Some(outer));
        assert_eq!(outer.buffer_holding(0x1010, 16), Some((0x1000, 64)));
        assert_eq!(outer.buffer_holding(0x1030, 32), None);
        assert!(outer.to_string().starts_with("`Stream::copy_device` at "));
        assert!(outer.to_string().contains("call.rs"));
        drop(g);
        assert_eq!(current_call(), None);
    }

    #[test]
    fn an_outer_call_naming_no_buffer_names_the_inner_calls_meanwhile() {
        let outer = ApiCall::here("DeviceRecordBatch::to_host");
        let _g = enter_public(outer);
        {
            let _inner = enter(ApiCall::here("Stream::copy_to_host").with_buffer(0x2000, 32));
            let now = current_call().unwrap();
            assert_eq!((now.method, now.location), (outer.method, outer.location));
            assert_eq!(now.buffers, [Some((0x2000, 32)), None]);
        }
        assert_eq!(current_call(), Some(outer));
    }
}
