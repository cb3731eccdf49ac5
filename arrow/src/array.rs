//! [`DeviceArray`]: one Arrow array whose buffers stay in device memory, and its copy to
//! an arrow-rs array on the host.

use std::fmt;
use std::sync::Arc;

use arrow::array::{make_array, ArrayData, ArrayRef};
use arrow::buffer::{Buffer, MutableBuffer};
use arrow::datatypes::DataType;
use cudabuf_core::{DeviceBuffer, Result, Stream};

use crate::arrow_error;
use crate::landing::{self, PinAsks};
use crate::layout::{type_layout, BufferKind};
use crate::ordering::check_stream;

/// An Arrow array whose buffers are [`DeviceBuffer`]s: the device-resident counterpart of
/// arrow-rs's `ArrayData`, with the same shape (validity bitmap, `buffers` in
/// `ArrayData::buffers` order, `children` in `ArrayData::child_data` order, and the
/// dictionary of a dictionary-encoded array).
///
/// Nothing here ever dereferences device memory on the host: arrow-rs arrays always read
/// their buffers, so a `DeviceArray` is not an arrow-rs array and never hands one device
/// memory. [`to_host`](Self::to_host) copies the buffers to the host and builds (and
/// fully validates) a real arrow-rs array.
///
/// Cheap to clone: the buffers are reference-counted slices. A `DeviceArray` read from an
/// IPC message is a set of zero-copy slices of the message body; it keeps the message's
/// device memory alive.
#[derive(Clone)]
pub struct DeviceArray {
    pub(crate) data_type: DataType,
    pub(crate) len: usize,
    pub(crate) offset: usize,
    pub(crate) null_count: usize,
    pub(crate) nulls: Option<DeviceBuffer>,
    pub(crate) buffers: Vec<DeviceBuffer>,
    pub(crate) children: Vec<DeviceArray>,
    pub(crate) dictionary: Option<Arc<DeviceArray>>,
}

impl DeviceArray {
    /// The Arrow data type.
    pub fn data_type(&self) -> &DataType {
        &self.data_type
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The offset in elements into the buffers where this array starts (0 for arrays read
    /// from IPC; may be more for arrays imported through the C Device Data Interface).
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of null elements (for the `Null` type, the length).
    pub fn null_count(&self) -> usize {
        self.null_count
    }

    /// The validity bitmap, if the array has one and any element is null.
    pub fn nulls(&self) -> Option<&DeviceBuffer> {
        self.nulls.as_ref()
    }

    /// The data buffers, as arrow-rs's `ArrayData::buffers`: values; offsets and values;
    /// views and variadic data; type ids and offsets; ... (no validity bitmap).
    pub fn buffers(&self) -> &[DeviceBuffer] {
        &self.buffers
    }

    /// The child arrays, as arrow-rs's `ArrayData::child_data` (list values, struct
    /// fields, union members, run ends and values); not the dictionary.
    pub fn children(&self) -> &[DeviceArray] {
        &self.children
    }

    /// The dictionary (values) of a dictionary-encoded array.
    pub fn dictionary(&self) -> Option<&DeviceArray> {
        self.dictionary.as_deref()
    }

    /// Every device buffer of this array, its children and its dictionary, depth first.
    pub fn device_buffers(&self) -> Vec<&DeviceBuffer> {
        let mut out = Vec::new();
        self.collect_buffers(&mut out);
        out
    }

    fn collect_buffers<'a>(&'a self, out: &mut Vec<&'a DeviceBuffer>) {
        out.extend(self.nulls.iter());
        out.extend(self.buffers.iter());
        for child in &self.children {
            child.collect_buffers(out);
        }
        if let Some(dictionary) = &self.dictionary {
            dictionary.collect_buffers(out);
        }
    }

    /// Copy the array to the host as an arrow-rs array (one device-to-host copy per
    /// buffer), validated like arrow-rs's IPC reader validates.
    ///
    /// # Errors
    /// [`Error::InvalidData`](cudabuf_core::Error::InvalidData) if the copied data is not a
    /// valid array of its type (corrupt offsets, dictionary keys out of range, ...); copy
    /// errors as [`DeviceBuffer::copy_to_host`].
    #[track_caller]
    pub fn to_host(&self) -> Result<ArrayRef> {
        let _call = crate::call::enter("DeviceArray::to_host");
        let host = HostCopy::new(&[])?;
        Ok(make_array(self.to_array_data(&host)?))
    }

    /// Copy the array to the host as [`to_host`](Self::to_host) does, with the copies
    /// issued on `stream` (after the work issued to it so far: an array imported with
    /// [`import_device_array_on`](crate::import_device_array_on) on this stream is read
    /// after its producer's event) into pinned memory, all issued before the first is
    /// waited for; returns when they are done.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](cudabuf_core::Error::InvalidArgument) if `stream` is not
    /// a stream of the buffers' context; as [`to_host`](Self::to_host).
    #[track_caller]
    pub fn to_host_on(&self, stream: &Stream) -> Result<ArrayRef> {
        let _call = crate::call::enter("DeviceArray::to_host_on");
        let host = HostCopy::new_on(&[], &self.device_buffers(), stream)?;
        Ok(make_array(self.to_array_data(&host)?))
    }

    /// Build host `ArrayData` from the buffers as `host` gives them.
    pub(crate) fn to_array_data(&self, host: &HostCopy) -> Result<ArrayData> {
        let nulls = match &self.nulls {
            Some(bitmap) if self.null_count > 0 => Some(host.buffer(bitmap)?),
            _ => None,
        };
        let layout = type_layout(&self.data_type)?;
        let buffers = self
            .buffers
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bytes = host.buffer(b)?;
                // arrow-rs reads these as typed slices, which must hold whole elements
                // (a corrupt or padded length may not): keep the whole elements.
                Ok(match layout.buffers.get(i) {
                    Some(BufferKind::Fixed(width) | BufferKind::Offsets(width)) if *width > 1 => {
                        bytes.slice_with_length(0, bytes.len() - bytes.len() % width)
                    }
                    _ => bytes,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut children = self
            .children
            .iter()
            .map(|c| c.to_array_data(host))
            .collect::<Result<Vec<_>>>()?;
        if let Some(dictionary) = &self.dictionary {
            children.push(dictionary.to_array_data(host)?);
        }
        let mut builder = ArrayData::builder(self.data_type.clone())
            .len(self.len)
            .offset(self.offset)
            .buffers(buffers)
            .child_data(children)
            .align_buffers(true);
        if nulls.is_some() {
            builder = builder.null_bit_buffer(nulls).null_count(self.null_count);
        }
        builder
            .build()
            .map_err(|e| arrow_error::invalid_data("Arrow array copied from the device", e))
    }
}

/// What [`DeviceArray::row_slice`] copies for a run of rows of a flat array.
pub(crate) struct RowSlice {
    /// Where the rows start in the copied buffers, in slots (below 8: the copies start at
    /// a whole byte of every bitmap).
    offset: usize,
    /// Whether `parts` starts with the validity bitmap's bytes.
    validity: bool,
    /// The device ranges to copy first: the validity bitmap's bytes (when `validity`),
    /// then one range of each buffer but a variable-size data buffer.
    pub(crate) parts: Vec<DeviceBuffer>,
    /// Variable-size binary and strings: the width of the offsets (the last of `parts`)
    /// and the whole data buffer, whose range between the first and the last of those
    /// offsets is copied once they are on the host.
    pub(crate) variable: Option<(usize, DeviceBuffer)>,
}

impl RowSlice {
    /// The data range of a variable-size column: the bytes between the first and the last
    /// of its copied `offsets` (`None` for other columns), and the first offset.
    pub(crate) fn data_range(&self, offsets: &Buffer) -> Result<Option<(DeviceBuffer, i64)>> {
        let Some((width, data)) = &self.variable else {
            return Ok(None);
        };
        let (first, last) = (
            read_offset(offsets, 0, *width),
            read_offset(offsets, offsets.len().saturating_sub(*width), *width),
        );
        let bad = |why: String| {
            cudabuf_core::Error::invalid_data("Arrow array copied from the device", why)
        };
        let (Some(first), Some(last)) = (first, last) else {
            return Err(bad("its offsets are shorter than its rows".into()));
        };
        if first < 0 || last < first {
            return Err(bad(format!(
                "offsets {first}..{last} of the copied rows run backwards or below 0"
            )));
        }
        let (start, end) = (first as u64, last as u64);
        if end > data.size() as u64 {
            return Err(bad(format!(
                "offsets up to {end} past the {}-byte data buffer",
                data.size()
            )));
        }
        Ok(Some((
            data.slice(start as usize, (end - start) as usize)?,
            first,
        )))
    }
}

/// The offset of `width` (4 or 8) bytes at byte `at` of `offsets`, if there.
fn read_offset(offsets: &[u8], at: usize, width: usize) -> Option<i64> {
    let bytes = offsets.get(at..at.checked_add(width)?)?;
    Some(match width {
        4 => i64::from(i32::from_le_bytes(bytes.try_into().ok()?)),
        _ => i64::from_le_bytes(bytes.try_into().ok()?),
    })
}

/// `offsets` (of `width` bytes each) less `base`: offsets into the copied data range.
/// Wrapping: offsets that run backwards are left for arrow-rs's validation to refuse.
fn rebase(offsets: &Buffer, width: usize, base: i64) -> Buffer {
    if width == 4 {
        let base = base as i32;
        Buffer::from_vec(
            offsets
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]).wrapping_sub(base))
                .collect::<Vec<i32>>(),
        )
    } else {
        Buffer::from_vec(
            offsets
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])).wrapping_sub(base))
                .collect::<Vec<i64>>(),
        )
    }
}

impl DeviceArray {
    /// Whether the array is flat: no children, no dictionary, and buffers of fixed-size
    /// elements or bits (primitives, booleans, decimals, temporal types, fixed-size
    /// binary, `Null`) or offsets and data (binary and strings, and their large forms), so
    /// that a run of rows lies in one byte range of each buffer.
    pub(crate) fn is_flat(&self) -> bool {
        self.children.is_empty()
            && self.dictionary.is_none()
            && type_layout(&self.data_type).is_ok_and(|layout| {
                !layout.variadic
                    && layout.children.is_empty()
                    && match layout.buffers.as_slice() {
                        [BufferKind::Offsets(_), BufferKind::Data] => true,
                        buffers => buffers
                            .iter()
                            .all(|b| matches!(b, BufferKind::Fixed(_) | BufferKind::Bits)),
                    }
            })
    }

    /// The device ranges that rows `offset..offset + length` of a flat array
    /// ([`is_flat`](Self::is_flat)) lie in, starting at a whole byte of every bitmap (the
    /// data of binary and strings comes after their offsets: [`RowSlice::data_range`]).
    /// The caller checked the rows are within the array.
    pub(crate) fn row_slice(&self, offset: usize, length: usize) -> Result<RowSlice> {
        const OPERATION: &str = "DeviceRecordBatch::to_host_slice";
        let overflow =
            || cudabuf_core::Error::invalid_data("Arrow array", "its slots overflow usize");
        let first = self.offset.checked_add(offset).ok_or_else(overflow)?;
        let end = first.checked_add(length).ok_or_else(overflow)?;
        let start = first - first % 8;
        let bits = |buffer: &DeviceBuffer| buffer.slice(start / 8, end.div_ceil(8) - start / 8);
        let validity = self.null_count > 0 && self.nulls.is_some();
        let mut parts = Vec::with_capacity(self.buffers.len() + 1);
        let mut variable = None;
        if let (true, Some(nulls)) = (validity, &self.nulls) {
            parts.push(bits(nulls)?);
        }
        let layout = type_layout(&self.data_type)?;
        for (buffer, kind) in self.buffers.iter().zip(&layout.buffers) {
            if let BufferKind::Data = kind {
                let width = match layout.buffers.first() {
                    Some(BufferKind::Offsets(width)) => *width,
                    _ => 0,
                };
                variable = Some((width, buffer.clone()));
                continue;
            }
            parts.push(match kind {
                BufferKind::Bits => bits(buffer)?,
                BufferKind::Fixed(width) => {
                    let from = start.checked_mul(*width).ok_or_else(overflow)?;
                    let to = end.checked_mul(*width).ok_or_else(overflow)?;
                    buffer.slice(from, to - from)?
                }
                BufferKind::Offsets(width) => {
                    // One offset more than rows: where the last row ends.
                    let from = start.checked_mul(*width).ok_or_else(overflow)?;
                    let to = end
                        .checked_add(1)
                        .and_then(|n| n.checked_mul(*width))
                        .ok_or_else(overflow)?;
                    buffer.slice(from, to - from)?
                }
                BufferKind::Data => {
                    return Err(cudabuf_core::Error::invalid_argument(
                        OPERATION,
                        "not a flat array",
                    ))
                }
            });
        }
        Ok(RowSlice {
            offset: first % 8,
            validity,
            parts,
            variable,
        })
    }

    /// The host array of `length` rows over the host copies of `slice`'s parts, taken
    /// from `host` in order, and of its data range (variable-size columns: `data`, with the
    /// first offset; null count counted on the host).
    pub(crate) fn rows_from_host(
        &self,
        slice: &RowSlice,
        length: usize,
        host: &mut impl Iterator<Item = Buffer>,
        data: Option<(Buffer, i64)>,
    ) -> Result<ArrayRef> {
        let mut next = || {
            host.next().ok_or_else(|| {
                cudabuf_core::Error::invalid_argument(
                    "DeviceRecordBatch::to_host_slice",
                    "fewer host copies than device ranges",
                )
            })
        };
        let nulls = if slice.validity { Some(next()?) } else { None };
        let mut buffers = (0..slice.parts.len() - usize::from(slice.validity))
            .map(|_| next())
            .collect::<Result<Vec<_>>>()?;
        if let (Some((width, _)), Some((bytes, base))) = (&slice.variable, data) {
            if let Some(offsets) = buffers.last_mut() {
                *offsets = rebase(offsets, *width, base);
            }
            buffers.push(bytes);
        }
        ArrayData::builder(self.data_type.clone())
            .len(length)
            .offset(slice.offset)
            .buffers(buffers)
            .null_bit_buffer(nulls)
            .align_buffers(true)
            .build()
            .map(make_array)
            .map_err(|e| arrow_error::invalid_data("Arrow array copied from the device", e))
    }
}

impl fmt::Debug for DeviceArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceArray")
            .field("data_type", &self.data_type)
            .field("len", &self.len)
            .field("offset", &self.offset)
            .field("null_count", &self.null_count)
            .field("nulls", &self.nulls)
            .field("buffers", &self.buffers)
            .field("children", &self.children)
            .field("dictionary", &self.dictionary)
            .finish()
    }
}

/// Host copies of whole device regions (message bodies), so that every buffer inside one
/// costs no copy of its own; buffers outside every region are copied one by one.
pub(crate) struct HostCopy {
    regions: Vec<(DeviceBuffer, Buffer)>,
    /// Where buffers outside every region are copied: on this stream, or synchronously.
    stream: Option<Stream>,
    /// The pinned blocks the copies lacked, pinned in the background when this is dropped:
    /// after the conversion that holds it has built its arrays, not beside its copies.
    asks: PinAsks,
}

/// Whether `inner` lies within `outer` (same context, address range inside).
fn lies_within(inner: &DeviceBuffer, outer: &DeviceBuffer) -> bool {
    if !outer.context().same_as(inner.context()) || inner.address() < outer.address() {
        return false;
    }
    let offset = (inner.address() - outer.address()) as usize;
    offset
        .checked_add(inner.size())
        .is_some_and(|end| end <= outer.size())
}

impl HostCopy {
    /// Copy each of `regions` to the host once (into a pinned block lent to arrow-rs
    /// where the context's pool allows it: see `landing`).
    pub(crate) fn new(regions: &[DeviceBuffer]) -> Result<Self> {
        let asks = PinAsks::default();
        let regions = regions
            .iter()
            .map(|r| Ok((r.clone(), landing::copy_to_host_asking(r, &asks)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(HostCopy {
            regions,
            stream: None,
            asks,
        })
    }

    /// Copy each of `regions`, and each of `buffers` outside them, to the host once, on
    /// `stream`: every copy is issued before the first is waited for.
    pub(crate) fn new_on(
        regions: &[DeviceBuffer],
        buffers: &[&DeviceBuffer],
        stream: &Stream,
    ) -> Result<Self> {
        let mut wanted: Vec<DeviceBuffer> = regions.to_vec();
        for &buffer in buffers {
            if !buffer.is_empty() && !wanted.iter().any(|r| lies_within(buffer, r)) {
                wanted.push(buffer.clone());
            }
        }
        if let Some(first) = wanted.first() {
            check_stream(first.context(), stream, "to_host_on")?;
        }
        let pending = wanted
            .iter()
            .map(|r| landing::start_copy_on(r, stream))
            .collect::<Result<Vec<_>>>()?;
        let asks = PinAsks::default();
        let regions = wanted
            .into_iter()
            .zip(pending)
            .map(|(region, copy)| Ok((region, copy.finish(&asks)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(HostCopy {
            regions,
            stream: Some(stream.clone()),
            asks,
        })
    }

    /// The host bytes of `device`: a slice of a region's copy, or a copy of its own.
    pub(crate) fn buffer(&self, device: &DeviceBuffer) -> Result<Buffer> {
        if device.is_empty() {
            return Ok(Buffer::from(MutableBuffer::new(0)));
        }
        for (region, host) in &self.regions {
            if lies_within(device, region) {
                let offset = (device.address() - region.address()) as usize;
                return Ok(host.slice_with_length(offset, device.size()));
            }
        }
        match &self.stream {
            Some(stream) => landing::start_copy_on(device, stream)?.finish(&self.asks),
            // A buffer outside every region (arrays imported through the C Device Data
            // Interface, say): a copy of its own, into a new vector.
            None => landing::land_pageable(device),
        }
    }
}
