//! The structs of the C Device Data Interface (`struct ArrowArray`, `struct
//! ArrowDeviceArray` of Arrow's `abi.h`), with private fields.
//!
//! An unreleased struct owns what its `release` callback frees, and [`Drop`] calls that
//! callback. If safe code could write the fields, it could copy a struct field by field
//! (two owners: a double release) or point `private_data` or `release` anywhere (a free of
//! a bogus pointer). So the fields are private: safe code reads them through accessors,
//! and builds a struct from its parts, moves one out of a raw pointer, or changes what
//! it owns only in `unsafe` code, under the contract written on each type.

use std::ffi::c_void;
use std::fmt;
use std::mem::ManuallyDrop;
use std::ptr;

use super::ArrowDeviceType;

/// The release callback of an [`ArrowArray`]: frees what the array owns and marks it
/// released (sets its `release` to null).
pub type ArrowArrayRelease = unsafe extern "C" fn(array: *mut ArrowArray);

/// The C Data Interface's `struct ArrowArray`: `#[repr(C)]`, field for field as in Arrow's
/// `abi.h` (80 bytes), so a pointer to one can be handed to C and back.
///
/// # Invariant
/// An `ArrowArray` is either *released* (its release callback is null; no other field
/// means anything), or a valid array of the C Data Interface, as its producer promises:
/// - `buffers` points to `n_buffers` buffer addresses (or `n_buffers` is 0), `children` to
///   `n_children` pointers to `ArrowArray`s (each released or valid, and writable: a
///   consumer may move a child out), `dictionary` is null or points to one; all of it
///   stays valid, and the memory behind the buffers allocated, until the release callback
///   is called;
/// - the release callback may be called once, from any thread, with a pointer to this
///   struct wherever it has been moved (the interface's structs are movable), and marks it
///   released.
///
/// Safe code cannot break it: the fields are private, every way to build an unreleased
/// `ArrowArray` from raw parts is `unsafe` with this as its contract, and arrays cudabuf
/// exports ([`export_device_array`](super::export_device_array)) uphold it. The accessors
/// rely on it.
///
/// Buffers of the arrays cudabuf exports are device addresses: never dereference them on
/// the host. Dropping an unreleased `ArrowArray` calls its release callback.
///
/// # Handing one to C
/// The interface moves structs: the consumer copies the struct and marks the source
/// released. Either hand C a pointer to a struct you keep (`Box::into_raw`, then free the
/// box with `Box::from_raw` after the call: dropping a moved-from struct does nothing,
/// and dropping one the consumer did not take releases it), or write the array into a
/// struct the consumer provides with [`std::ptr::write`] (`unsafe`: the destination must
/// be valid for writes; the old contents are not released).
#[repr(C)]
pub struct ArrowArray {
    length: i64,
    null_count: i64,
    offset: i64,
    n_buffers: i64,
    n_children: i64,
    buffers: *mut *const c_void,
    children: *mut *mut ArrowArray,
    dictionary: *mut ArrowArray,
    release: Option<ArrowArrayRelease>,
    private_data: *mut c_void,
}

// SAFETY: an unreleased array's release callback may be called from any thread (the
// type's invariant), and the structs cudabuf makes own only `DeviceBuffer`s and `Event`s
// (Send + Sync) and plain heap memory (the event's handle variable).
// arrow-rs's `FFI_ArrowArray` makes the same choice.
unsafe impl Send for ArrowArray {}
// SAFETY: shared references read plain fields and, through the accessors, the producer's
// immutable buffer and child pointers; releasing or moving needs `&mut` or ownership.
unsafe impl Sync for ArrowArray {}

/// The fields of an [`ArrowArray`], as plain data: what a producer fills to build one
/// with the `unsafe` [`ArrowArray::from_parts`], and what [`ArrowArray::into_parts`] gives
/// back. Holding parts owns nothing: nothing is released when they are dropped.
#[derive(Debug, Clone, Copy)]
pub struct ArrowArrayParts {
    /// The logical length.
    pub length: i64,
    /// The number of nulls (-1: not computed).
    pub null_count: i64,
    /// The logical offset into the buffers.
    pub offset: i64,
    /// The number of buffers.
    pub n_buffers: i64,
    /// The number of children.
    pub n_children: i64,
    /// `n_buffers` buffer addresses (device memory for a device array).
    pub buffers: *mut *const c_void,
    /// `n_children` child arrays.
    pub children: *mut *mut ArrowArray,
    /// The dictionary of a dictionary-encoded array, or null.
    pub dictionary: *mut ArrowArray,
    /// Frees the array; null for a released array.
    pub release: Option<ArrowArrayRelease>,
    /// The producer's private data, for its release callback.
    pub private_data: *mut c_void,
}

impl ArrowArray {
    /// A released array (all zero, no release callback), for a producer to fill or to
    /// move another array into.
    ///
    /// ```
    /// let array = cudabuf_arrow::ArrowArray::empty();
    /// assert!(array.is_released());
    /// assert_eq!(array.n_buffers(), 0);
    /// ```
    pub const fn empty() -> Self {
        ArrowArray {
            length: 0,
            null_count: 0,
            offset: 0,
            n_buffers: 0,
            n_children: 0,
            buffers: ptr::null_mut(),
            children: ptr::null_mut(),
            dictionary: ptr::null_mut(),
            release: None,
            private_data: ptr::null_mut(),
        }
    }

    /// An array made of `parts` (which it now owns: it is released when dropped).
    ///
    /// # Safety
    /// `parts.release` is null, or the parts form a valid array of the C Data Interface as
    /// the [type's invariant](ArrowArray#invariant) says, owned by no one else: the
    /// returned array is the only one to call `parts.release`.
    pub const unsafe fn from_parts(parts: ArrowArrayParts) -> Self {
        ArrowArray {
            length: parts.length,
            null_count: parts.null_count,
            offset: parts.offset,
            n_buffers: parts.n_buffers,
            n_children: parts.n_children,
            buffers: parts.buffers,
            children: parts.children,
            dictionary: parts.dictionary,
            release: parts.release,
            private_data: parts.private_data,
        }
    }

    /// The array's fields, giving up ownership: the caller is now responsible for calling
    /// `release` (not calling it leaks what the array holds, which is safe).
    ///
    /// ```
    /// let parts = cudabuf_arrow::ArrowArray::empty().into_parts();
    /// assert!(parts.release.is_none() && parts.buffers.is_null());
    /// ```
    pub fn into_parts(self) -> ArrowArrayParts {
        let array = ManuallyDrop::new(self);
        ArrowArrayParts {
            length: array.length,
            null_count: array.null_count,
            offset: array.offset,
            n_buffers: array.n_buffers,
            n_children: array.n_children,
            buffers: array.buffers,
            children: array.children,
            dictionary: array.dictionary,
            release: array.release,
            private_data: array.private_data,
        }
    }

    /// Move the array out of `source` (the C Data Interface's "move"): the returned value
    /// owns it, and `source` is marked released (its `release` set to null), so dropping
    /// or releasing `source` afterwards does nothing. The memory at `source` stays the
    /// caller's.
    ///
    /// ```
    /// use cudabuf_arrow::ArrowArray;
    ///
    /// let mut slot = ArrowArray::empty();
    /// // SAFETY: `slot` is a valid, initialized array.
    /// let moved = unsafe { ArrowArray::from_raw(&mut slot) };
    /// assert!(moved.is_released() && slot.is_released());
    /// ```
    ///
    /// # Safety
    /// `source` is valid for reads and writes of an `ArrowArray`, aligned, and holds an
    /// initialized one that is released or valid as the [type's
    /// invariant](ArrowArray#invariant) says (what a C producer writes is taken on its
    /// word).
    pub unsafe fn from_raw(source: *mut ArrowArray) -> Self {
        // SAFETY: forwarded from this function's contract. After the read, the source is
        // marked released, so its release callback belongs to the returned value alone.
        unsafe {
            let moved = ptr::read(source);
            ptr::addr_of_mut!((*source).release).write(None);
            moved
        }
    }

    /// Whether the array is released (its release callback is null).
    pub fn is_released(&self) -> bool {
        self.release.is_none()
    }

    /// The logical length, as the producer wrote it.
    pub fn length(&self) -> i64 {
        self.length
    }

    /// The number of nulls, as the producer wrote it (-1: not computed).
    pub fn null_count(&self) -> i64 {
        self.null_count
    }

    /// The logical offset into the buffers, as the producer wrote it.
    pub fn offset(&self) -> i64 {
        self.offset
    }

    /// The number of buffers, as the producer wrote it.
    pub fn n_buffers(&self) -> i64 {
        self.n_buffers
    }

    /// The number of children, as the producer wrote it.
    pub fn n_children(&self) -> i64 {
        self.n_children
    }

    /// The buffer addresses (device addresses for a device array: never dereference them
    /// on the host). Empty for a released array, and where the producer wrote a null
    /// `buffers` or a count below 1.
    pub fn buffers(&self) -> &[*const c_void] {
        match usize::try_from(self.n_buffers) {
            Ok(n) if n > 0 && !self.buffers.is_null() && !self.is_released() => {
                // SAFETY: an unreleased array's `buffers` holds `n_buffers` addresses,
                // valid until it is released, which needs `&mut self` (the invariant).
                unsafe { std::slice::from_raw_parts(self.buffers, n) }
            }
            _ => &[],
        }
    }

    /// Child `index`, or `None` if the array is released, has no such child, or the
    /// producer wrote a null pointer for it. A child a consumer moved out is there, and
    /// released.
    pub fn child(&self, index: usize) -> Option<&ArrowArray> {
        let n = usize::try_from(self.n_children).ok()?;
        if index >= n || self.children.is_null() || self.is_released() {
            return None;
        }
        // SAFETY: an unreleased array's `children` holds `n_children` pointers, each null
        // or to an `ArrowArray`, valid until the array is released (the invariant).
        unsafe { (*self.children.add(index)).as_ref() }
    }

    /// The dictionary of a dictionary-encoded array; `None` if there is none or the array
    /// is released.
    pub fn dictionary(&self) -> Option<&ArrowArray> {
        if self.is_released() {
            return None;
        }
        // SAFETY: an unreleased array's `dictionary` is null or points to an
        // `ArrowArray` valid until the array is released (the invariant).
        unsafe { self.dictionary.as_ref() }
    }

    /// The release callback (null, `None`, once released).
    pub fn release_callback(&self) -> Option<ArrowArrayRelease> {
        self.release
    }

    /// The producer's private data pointer (for its release callback; opaque to
    /// everyone else).
    pub fn private_data(&self) -> *mut c_void {
        self.private_data
    }
}

impl Default for ArrowArray {
    /// A released array, as [`ArrowArray::empty`].
    fn default() -> Self {
        ArrowArray::empty()
    }
}

impl Drop for ArrowArray {
    fn drop(&mut self) {
        if let Some(release) = self.release {
            // SAFETY: an unreleased array's callback may be called once with a pointer to
            // it (the invariant); it marks the array released, and this is the last use.
            unsafe { release(self) };
        }
    }
}

impl fmt::Debug for ArrowArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrowArray")
            .field("length", &self.length)
            .field("null_count", &self.null_count)
            .field("offset", &self.offset)
            .field("n_buffers", &self.n_buffers)
            .field("n_children", &self.n_children)
            .field("released", &self.is_released())
            .finish()
    }
}

/// The C Device Data Interface's `struct ArrowDeviceArray`: an [`ArrowArray`] whose
/// buffers live on a device, which device, and an optional event to wait for.
/// `#[repr(C)]`, field for field as in Arrow's `abi.h` (128 bytes).
///
/// # Invariant
/// The array is released, or valid as [`ArrowArray`'s invariant](ArrowArray#invariant)
/// says with its buffers in the memory of the device `device_type` / `device_id` name;
/// `sync_event` is null, or a pointer to an event of that device type that the consumer
/// must wait on before reading the buffers, recorded after the producer's work: for
/// CUDA a `CUevent*` (the address of a variable holding a `CUevent`), for
/// [`ARROW_DEVICE_EXT_DEV`](super::ARROW_DEVICE_EXT_DEV) as cudabuf's simulator exports it
/// the address of a `u64` holding a simulator event handle; the variable and the event
/// stay valid until the array is released (the producer owns both). As for `ArrowArray`,
/// the fields are private and only `unsafe` code builds one from raw parts.
///
/// Handing one to C works as for [`ArrowArray`](ArrowArray#handing-one-to-c).
#[repr(C)]
pub struct ArrowDeviceArray {
    array: ArrowArray,
    device_id: i64,
    device_type: ArrowDeviceType,
    sync_event: *mut c_void,
    reserved: [i64; 3],
}

// SAFETY: as for `ArrowArray`; `sync_event` is read only by an import, which owns the
// array, and the events cudabuf exports may be waited on and destroyed from any thread.
unsafe impl Send for ArrowDeviceArray {}
// SAFETY: as for `ArrowArray`.
unsafe impl Sync for ArrowDeviceArray {}

/// The parts of an [`ArrowDeviceArray`]: what [`ArrowDeviceArray::from_parts`] takes and
/// [`ArrowDeviceArray::into_parts`] gives back. The `array` is owned (released when the
/// parts are dropped); the rest is plain data.
#[derive(Debug)]
pub struct ArrowDeviceArrayParts {
    /// The array; its buffers are addresses on the device.
    pub array: ArrowArray,
    /// The device ordinal.
    pub device_id: i64,
    /// The kind of device ([`ARROW_DEVICE_CUDA`](super::ARROW_DEVICE_CUDA), ...).
    pub device_type: ArrowDeviceType,
    /// A pointer to an event to wait on before reading the buffers (`CUevent*` for
    /// CUDA), or null (the data is ready).
    pub sync_event: *mut c_void,
}

impl ArrowDeviceArray {
    /// A released device array (all zero), for a producer to fill or to move another array
    /// into.
    ///
    /// ```
    /// let array = cudabuf_arrow::ArrowDeviceArray::empty();
    /// assert!(array.is_released());
    /// assert!(array.sync_event().is_null());
    /// ```
    pub const fn empty() -> Self {
        ArrowDeviceArray {
            array: ArrowArray::empty(),
            device_id: 0,
            device_type: 0,
            sync_event: ptr::null_mut(),
            reserved: [0; 3],
        }
    }

    /// A device array of `parts` (the reserved words zero).
    ///
    /// # Safety
    /// `parts.array` is released, or its buffers are memory of the device that
    /// `parts.device_type` and `parts.device_id` name, allocated until the array is
    /// released; `parts.sync_event` is null or points to an event of that device type
    /// (for CUDA a `CUevent*`), the pointer and the event valid as long (the [type's
    /// invariant](ArrowDeviceArray#invariant)).
    pub unsafe fn from_parts(parts: ArrowDeviceArrayParts) -> Self {
        ArrowDeviceArray {
            array: parts.array,
            device_id: parts.device_id,
            device_type: parts.device_type,
            sync_event: parts.sync_event,
            reserved: [0; 3],
        }
    }

    /// The parts of the array; the returned `array` owns what this one owned.
    ///
    /// ```
    /// let parts = cudabuf_arrow::ArrowDeviceArray::empty().into_parts();
    /// assert!(parts.array.is_released());
    /// ```
    pub fn into_parts(self) -> ArrowDeviceArrayParts {
        ArrowDeviceArrayParts {
            array: self.array,
            device_id: self.device_id,
            device_type: self.device_type,
            sync_event: self.sync_event,
        }
    }

    /// Move the array out of `source` (the C Data Interface's "move"): the returned value
    /// owns it, and `source` is marked released (its array's `release` set to null), so
    /// dropping or releasing `source` afterwards does nothing. The memory at `source` stays
    /// the caller's.
    ///
    /// # Safety
    /// `source` is valid for reads and writes of an `ArrowDeviceArray`, aligned, and holds
    /// an initialized one that is released or valid as the [type's
    /// invariant](ArrowDeviceArray#invariant) says (what a C producer writes, pyarrow's
    /// `_export_to_c_device` say, is taken on its word).
    pub unsafe fn from_raw(source: *mut ArrowDeviceArray) -> Self {
        // SAFETY: forwarded from this function's contract. After the read, the source is
        // marked released, so its release callback belongs to the returned value alone.
        unsafe {
            let moved = ptr::read(source);
            ptr::addr_of_mut!((*source).array.release).write(None);
            moved
        }
    }

    /// Whether the array is released.
    pub fn is_released(&self) -> bool {
        self.array.is_released()
    }

    /// The array; its buffers are addresses on the device.
    pub fn array(&self) -> &ArrowArray {
        &self.array
    }

    /// The device ordinal.
    pub fn device_id(&self) -> i64 {
        self.device_id
    }

    /// The kind of device ([`ARROW_DEVICE_CUDA`](super::ARROW_DEVICE_CUDA), ...).
    pub fn device_type(&self) -> ArrowDeviceType {
        self.device_type
    }

    /// A pointer to the event to wait on before reading the buffers (`CUevent*` for
    /// CUDA: the address of a `CUevent` variable), or null when the data is ready. Valid
    /// until the array is released.
    pub fn sync_event(&self) -> *mut c_void {
        self.sync_event
    }

    /// The reserved words (zero in what cudabuf exports; not read on import).
    pub fn reserved(&self) -> [i64; 3] {
        self.reserved
    }
}

impl Default for ArrowDeviceArray {
    /// A released device array, as [`ArrowDeviceArray::empty`].
    fn default() -> Self {
        ArrowDeviceArray::empty()
    }
}

impl fmt::Debug for ArrowDeviceArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrowDeviceArray")
            .field("array", &self.array)
            .field("device_id", &self.device_id)
            .field("device_type", &self.device_type)
            .field("sync_event", &self.sync_event)
            .finish()
    }
}

// The layout of Arrow's abi.h on every 64-bit target (the tests below check each offset).
const _: () = assert!(std::mem::size_of::<ArrowArray>() == 80);
const _: () = assert!(std::mem::size_of::<ArrowDeviceArray>() == 128);

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    #[test]
    fn arrow_array_has_the_layout_of_abi_h() {
        assert_eq!(size_of::<ArrowArray>(), 80);
        assert_eq!(align_of::<ArrowArray>(), 8);
        let offsets = [
            offset_of!(ArrowArray, length),
            offset_of!(ArrowArray, null_count),
            offset_of!(ArrowArray, offset),
            offset_of!(ArrowArray, n_buffers),
            offset_of!(ArrowArray, n_children),
            offset_of!(ArrowArray, buffers),
            offset_of!(ArrowArray, children),
            offset_of!(ArrowArray, dictionary),
            offset_of!(ArrowArray, release),
            offset_of!(ArrowArray, private_data),
        ];
        assert_eq!(offsets, [0, 8, 16, 24, 32, 40, 48, 56, 64, 72]);
        // A null function pointer is `None`: C's NULL `release` reads as released.
        assert_eq!(size_of::<Option<ArrowArrayRelease>>(), 8);
    }

    #[test]
    fn arrow_device_array_has_the_layout_of_abi_h() {
        assert_eq!(size_of::<ArrowDeviceArray>(), 128);
        assert_eq!(align_of::<ArrowDeviceArray>(), 8);
        let offsets = [
            offset_of!(ArrowDeviceArray, array),
            offset_of!(ArrowDeviceArray, device_id),
            offset_of!(ArrowDeviceArray, device_type),
            offset_of!(ArrowDeviceArray, sync_event),
            offset_of!(ArrowDeviceArray, reserved),
        ];
        assert_eq!(offsets, [0, 80, 88, 96, 104]);
        assert_eq!(size_of::<ArrowDeviceType>(), 4);
    }

    #[test]
    fn all_zero_bytes_are_a_released_array() {
        // What a C consumer's `struct ArrowDeviceArray out = {0};` is.
        // SAFETY: every field of both structs is an integer, a raw pointer or an
        // `Option` of a function pointer, for all of which zero bytes are valid.
        let zeroed: ArrowDeviceArray = unsafe { std::mem::zeroed() };
        assert!(zeroed.is_released());
        assert!(zeroed.array().buffers().is_empty());
        assert!(zeroed.array().child(0).is_none() && zeroed.array().dictionary().is_none());
    }
}
