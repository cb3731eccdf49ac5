//! Core's view of a backend's optional capabilities: the stream and event calls on a
//! `dyn RawContext`, answered by its [`RawStreams`] (or
//! [`Error::Unsupported`](crate::Error::Unsupported) when it has none) and its
//! [`OrderingHooks`](super::OrderingHooks) (or what CUDA needs when it has none).

use super::{
    copy_device_to_host_as_on, copy_host_to_device_as_on, event_poll, event_wait_bookkeeping,
    mark_alloc_on, mark_free_on, promised_copy_device_to_host_on, promised_copy_host_to_device_on,
    retire_accesses, stream_wait_bookkeeping, streams_of, DevicePtr, RawContext, RawEvent,
    RawStream, StreamFlags,
};
use crate::error::Result;

/// The stream, event and ordering calls core makes on a backend context.
pub(crate) trait StreamsExt {
    /// [`RawStreams::stream_priority_range`] (or its ordering hook) of this context's backend.
    fn stream_priority_range(&self) -> Result<(i32, i32)>;
    /// [`RawStreams::stream_create`] (or its ordering hook) of this context's backend.
    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream>;
    /// [`RawStreams::stream_destroy`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()>;
    /// [`RawStreams::stream_synchronize`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()>;
    /// [`RawStreams::stream_query`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool>;
    /// [`RawStreams::stream_wait_event`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()>;
    /// [`RawStreams::event_create`] (or its ordering hook) of this context's backend.
    fn event_create(&self, timing: bool) -> Result<RawEvent>;
    /// [`RawStreams::event_destroy`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()>;
    /// [`RawStreams::event_record`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()>;
    /// [`RawStreams::event_query`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn event_query(&self, event: RawEvent) -> Result<bool>;
    /// [`RawStreams::event_synchronize`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()>;
    /// [`RawStreams::event_elapsed_ms`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32>;
    /// [`RawStreams::copy_host_to_device_on`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// [`RawStreams::copy_device_to_host_on`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// [`OrderingHooks::promised_copy_host_to_device_on`](super::OrderingHooks::promised_copy_host_to_device_on)
    /// of this context's backend, or `copy_host_to_device_on` without hooks.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn promised_copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()>;
    /// [`OrderingHooks::promised_copy_device_to_host_on`](super::OrderingHooks::promised_copy_device_to_host_on)
    /// of this context's backend, or `copy_device_to_host_on` without hooks.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn promised_copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()>;
    /// [`RawStreams::copy_device_to_device_on`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn copy_device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// [`RawStreams::copy_peer_on`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()>;
    /// [`RawStreams::event_poll`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn event_poll(&self, event: RawEvent) -> Result<bool>;
    /// [`RawStreams::mark_free_on`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn mark_free_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()>;
    /// [`RawStreams::mark_alloc_on`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn mark_alloc_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()>;
    /// [`RawStreams::stream_wait_bookkeeping`] (or its ordering hook) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn stream_wait_bookkeeping(&self, stream: RawStream) -> Result<()>;
    /// [`OrderingHooks::event_wait_bookkeeping`] (or `event_synchronize` without hooks) of this context's backend.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn event_wait_bookkeeping(&self, event: RawEvent) -> Result<()>;
    /// [`OrderingHooks::copy_host_to_device_as_on`] of this context's backend, or
    /// `copy_host_to_device_unpinned` without hooks.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn copy_host_to_device_as_on(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: RawStream,
        in_flight: bool,
    ) -> Result<()>;
    /// [`OrderingHooks::copy_device_to_host_as_on`] of this context's backend, or
    /// `copy_device_to_host_unpinned` without hooks.
    ///
    /// # Safety
    /// As the method it forwards to.
    unsafe fn copy_device_to_host_as_on(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: RawStream,
    ) -> Result<()>;
    /// Whether this context's backend checks ordering (has [`OrderingHooks`](super::OrderingHooks)).
    fn checks_ordering(&self) -> bool;
    /// [`RawStreams::retire_accesses`] (or its ordering hook) of this context's backend.
    fn retire_accesses(&self, address: DevicePtr, len: usize);
}

impl StreamsExt for dyn RawContext {
    fn stream_priority_range(&self) -> Result<(i32, i32)> {
        streams_of(self, "stream_priority_range")?.stream_priority_range()
    }

    fn stream_create(&self, flags: StreamFlags) -> Result<RawStream> {
        streams_of(self, "stream_create")?.stream_create(flags)
    }

    unsafe fn stream_destroy(&self, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "stream_destroy")?.stream_destroy(stream) }
    }

    unsafe fn stream_synchronize(&self, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "stream_synchronize")?.stream_synchronize(stream) }
    }

    unsafe fn stream_query(&self, stream: RawStream) -> Result<bool> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "stream_query")?.stream_query(stream) }
    }

    unsafe fn stream_wait_event(&self, stream: RawStream, event: RawEvent) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "stream_wait_event")?.stream_wait_event(stream, event) }
    }

    fn event_create(&self, timing: bool) -> Result<RawEvent> {
        streams_of(self, "event_create")?.event_create(timing)
    }

    unsafe fn event_destroy(&self, event: RawEvent) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "event_destroy")?.event_destroy(event) }
    }

    unsafe fn event_record(&self, event: RawEvent, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "event_record")?.event_record(event, stream) }
    }

    unsafe fn event_query(&self, event: RawEvent) -> Result<bool> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "event_query")?.event_query(event) }
    }

    unsafe fn event_synchronize(&self, event: RawEvent) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "event_synchronize")?.event_synchronize(event) }
    }

    unsafe fn event_elapsed_ms(&self, start: RawEvent, end: RawEvent) -> Result<f32> {
        // SAFETY: forwarded from this method's contract.
        unsafe { streams_of(self, "event_elapsed_ms")?.event_elapsed_ms(start, end) }
    }

    unsafe fn copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe {
            streams_of(self, "copy_host_to_device_on")?
                .copy_host_to_device_on(dst, src, len, stream)
        }
    }

    unsafe fn copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe {
            streams_of(self, "copy_device_to_host_on")?
                .copy_device_to_host_on(dst, src, len, stream)
        }
    }

    unsafe fn promised_copy_host_to_device_on(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()> {
        let streams = streams_of(self, "copy_host_to_device_on")?;
        // SAFETY: forwarded from this method's contract.
        unsafe { promised_copy_host_to_device_on(streams, dst, src, len, stream, since) }
    }

    unsafe fn promised_copy_device_to_host_on(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
        since: Option<RawEvent>,
    ) -> Result<()> {
        let streams = streams_of(self, "copy_device_to_host_on")?;
        // SAFETY: forwarded from this method's contract.
        unsafe { promised_copy_device_to_host_on(streams, dst, src, len, stream, since) }
    }

    unsafe fn copy_device_to_device_on(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe {
            streams_of(self, "copy_device_to_device_on")?
                .copy_device_to_device_on(dst, src, len, stream)
        }
    }

    unsafe fn copy_peer_on(
        &self,
        dst: DevicePtr,
        src_context: &dyn RawContext,
        src: DevicePtr,
        len: usize,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe {
            streams_of(self, "copy_peer_on")?.copy_peer_on(dst, src_context, src, len, stream)
        }
    }

    unsafe fn event_poll(&self, event: RawEvent) -> Result<bool> {
        // SAFETY: forwarded from this method's contract.
        unsafe { event_poll(streams_of(self, "event_poll")?, event) }
    }

    unsafe fn mark_free_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { mark_free_on(streams_of(self, "mark_free_on")?, ptr, len, stream) }
    }

    unsafe fn mark_alloc_on(&self, ptr: DevicePtr, len: usize, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { mark_alloc_on(streams_of(self, "mark_alloc_on")?, ptr, len, stream) }
    }

    unsafe fn stream_wait_bookkeeping(&self, stream: RawStream) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { stream_wait_bookkeeping(streams_of(self, "stream_wait_bookkeeping")?, stream) }
    }

    unsafe fn event_wait_bookkeeping(&self, event: RawEvent) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { event_wait_bookkeeping(streams_of(self, "event_wait_bookkeeping")?, event) }
    }

    unsafe fn copy_host_to_device_as_on(
        &self,
        dst: DevicePtr,
        src: &[u8],
        stream: RawStream,
        in_flight: bool,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { copy_host_to_device_as_on(self, dst, src, stream, in_flight) }
    }

    unsafe fn copy_device_to_host_as_on(
        &self,
        dst: &mut [u8],
        src: DevicePtr,
        stream: RawStream,
    ) -> Result<()> {
        // SAFETY: forwarded from this method's contract.
        unsafe { copy_device_to_host_as_on(self, dst, src, stream) }
    }

    fn checks_ordering(&self) -> bool {
        self.streams().is_some_and(|s| s.ordering().is_some())
    }

    fn retire_accesses(&self, address: DevicePtr, len: usize) {
        retire_accesses(self, address, len)
    }
}
