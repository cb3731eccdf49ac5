//! From a record batch or dictionary batch message (flatbuffer metadata on the host, body
//! on the device) to [`DeviceArray`]s whose buffers are zero-copy slices of the body.
//!
//! The walk follows the IPC format (and arrow-rs's reader): the fields depth first, one
//! field node per array, then its buffers, then its children. Every node and buffer
//! descriptor is checked against the body and against the minimum sizes of the type's
//! layout, so that a corrupt message is an [`Error::InvalidData`] and never a device
//! buffer that is shorter than its array claims. Offsets, type ids and dictionary keys
//! are device data and are not inspected here; [`DeviceArray::to_host`] validates them.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, FieldRef, Fields};
use arrow::ipc::{self, MetadataVersion};
use cudabuf_core::{DeviceBuffer, Error, Result};

use crate::array::DeviceArray;
use crate::layout::{min_child_len, nested_fields, type_layout, BufferKind};

const WHAT: &str = "Arrow IPC record batch";

/// A field's position in a schema: child indices from the top, descending into dictionary
/// value types as IPC schemas do.
pub(crate) type FieldPath = Vec<usize>;

/// The dictionary id of every dictionary-encoded field of a stream's schema, by path.
pub(crate) type DictionaryIds = HashMap<FieldPath, i64>;

/// A dictionary read from a dictionary batch: its values and the bodies they live in.
#[derive(Debug, Clone)]
pub(crate) struct DictionaryEntry {
    pub(crate) values: Arc<DeviceArray>,
    /// The message bodies the values (and nested dictionaries) are slices of.
    pub(crate) bodies: Vec<DeviceBuffer>,
}

/// The dictionaries of a stream so far, by id.
pub(crate) type Dictionaries = HashMap<i64, DictionaryEntry>;

/// A decoded record batch.
pub(crate) struct Decoded {
    pub(crate) num_rows: usize,
    pub(crate) columns: Vec<DeviceArray>,
    /// The bodies of the dictionaries the columns use.
    pub(crate) dictionary_bodies: Vec<DeviceBuffer>,
}

/// Collect the dictionary ids of an IPC schema, by field path.
pub(crate) fn dictionary_ids(schema: ipc::Schema<'_>) -> DictionaryIds {
    fn walk<'a, I>(fields: I, path: &mut FieldPath, out: &mut DictionaryIds)
    where
        I: Iterator<Item = ipc::Field<'a>>,
    {
        for (i, field) in fields.enumerate() {
            path.push(i);
            if let Some(dictionary) = field.dictionary() {
                out.insert(path.clone(), dictionary.id());
            }
            if let Some(children) = field.children() {
                walk(children.iter(), path, out);
            }
            path.pop();
        }
    }
    let mut out = DictionaryIds::new();
    if let Some(fields) = schema.fields() {
        walk(fields.iter(), &mut Vec::new(), &mut out);
    }
    out
}

/// Check that the fields of a schema sharing a dictionary id can share one dictionary:
/// the same value type, and the same dictionary ids below it (for nested dictionaries).
/// Otherwise a dictionary batch of that id would be decoded as whichever field was
/// found first, and the other field's column would hold values of another type.
///
/// Gives the reason (naming both fields and the id) if they cannot.
pub(crate) fn check_shared_dictionary_ids(
    ids: &DictionaryIds,
    fields: &Fields,
) -> std::result::Result<(), String> {
    // In path order, a field's descendants follow it.
    let mut paths: Vec<(&FieldPath, i64)> = ids.iter().map(|(p, &id)| (p, id)).collect();
    paths.sort_unstable();
    // The ids below the field at `paths[i]`, by path relative to it.
    let below = |i: usize| -> Vec<(&[usize], i64)> {
        let prefix = paths[i].0;
        paths[i + 1..]
            .iter()
            .take_while(|(p, _)| p.starts_with(prefix))
            .map(|(p, id)| (&p[prefix.len()..], *id))
            .collect()
    };
    let name = |path: &FieldPath| {
        field_at(fields, path).map_or_else(|| format!("{path:?}"), |f| format!("'{}'", f.name()))
    };
    // Each id's first field, as an index into `paths`.
    let mut first: HashMap<i64, usize> = HashMap::new();
    for (i, &(path, id)) in paths.iter().enumerate() {
        let Some(&j) = first.get(&id) else {
            first.insert(id, i);
            continue;
        };
        let earlier = paths[j].0;
        let value_type = |p: &FieldPath| match field_at(fields, p).map(|f| f.data_type()) {
            Some(DataType::Dictionary(_, values)) => Some((**values).clone()),
            _ => None,
        };
        let (a, b) = (value_type(earlier), value_type(path));
        let show = |t: Option<DataType>| t.map_or_else(|| "none".to_string(), |t| t.to_string());
        let differ = if a != b {
            format!(
                "their dictionaries' value types differ ({} and {})",
                show(a),
                show(b)
            )
        } else if below(j) != below(i) {
            "the dictionaries nested in their values differ".to_string()
        } else {
            continue;
        };
        return Err(format!(
            "fields {} and {} share dictionary id {id}, but {differ}: one dictionary cannot serve both",
            name(earlier),
            name(path)
        ));
    }
    Ok(())
}

/// The field at `path` in `fields`.
pub(crate) fn field_at<'a>(fields: &'a Fields, path: &[usize]) -> Option<&'a FieldRef> {
    let (first, rest) = path.split_first()?;
    let mut field = fields.get(*first)?;
    for &i in rest {
        field = *nested_fields(field.data_type()).get(i)?;
    }
    Some(field)
}

/// The field nodes, buffer descriptors and variadic buffer counts of a record batch
/// message: as the message has them ([`BatchLayout::of`]), or rewritten by a reader that
/// landed only some columns or decompressed the body on the host, so that they describe
/// the device body it made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BatchLayout {
    /// Field nodes `(length, null_count)`, in order.
    pub(crate) nodes: Vec<(i64, i64)>,
    /// Buffer descriptors `(offset, length)` into the body, in order.
    pub(crate) buffers: Vec<(i64, i64)>,
    /// Variadic buffer counts, in order.
    pub(crate) variadic_counts: Vec<i64>,
}

/// The share of a [`BatchLayout`] one top-level field takes: index ranges into its
/// nodes, buffers and variadic counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FieldExtent {
    pub(crate) nodes: Range<usize>,
    pub(crate) buffers: Range<usize>,
    pub(crate) variadic_counts: Range<usize>,
}

impl BatchLayout {
    /// The layout the message's metadata gives.
    pub(crate) fn of(batch: ipc::RecordBatch<'_>) -> Self {
        BatchLayout {
            nodes: batch
                .nodes()
                .map(|n| n.iter().map(|n| (n.length(), n.null_count())).collect())
                .unwrap_or_default(),
            buffers: batch
                .buffers()
                .map(|b| b.iter().map(|b| (b.offset(), b.length())).collect())
                .unwrap_or_default(),
            variadic_counts: batch
                .variadicBufferCounts()
                .map(|v| v.iter().collect())
                .unwrap_or_default(),
        }
    }

    /// What each top-level field of `fields` takes of this layout, walking the fields as
    /// the decoder does (nothing is checked but that the counts fit).
    ///
    /// # Errors
    /// [`Error::InvalidData`] when the fields need more nodes, buffers or variadic counts
    /// than the layout has, or a variadic count is negative; [`Error::Unsupported`] for a
    /// type without a layout.
    pub(crate) fn field_extents(
        &self,
        fields: &Fields,
        version: MetadataVersion,
    ) -> Result<Vec<FieldExtent>> {
        fn walk(
            layout: &BatchLayout,
            field: &Field,
            version: MetadataVersion,
            at: &mut (usize, usize, usize),
        ) -> Result<()> {
            let data_type = field.data_type();
            let type_layout = type_layout(data_type)?;
            at.0 += 1;
            let v4_union_validity =
                version < MetadataVersion::V5 && matches!(data_type, DataType::Union(..));
            at.1 +=
                usize::from(type_layout.validity || v4_union_validity) + type_layout.buffers.len();
            if type_layout.variadic {
                let count = layout.variadic_counts.get(at.2).copied().ok_or_else(|| {
                    Error::invalid_data(
                        WHAT,
                        format!("field '{}': no variadic buffer count", field.name()),
                    )
                })?;
                at.2 += 1;
                let count = usize::try_from(count)
                    .ok()
                    .filter(|&c| c <= layout.buffers.len())
                    .ok_or_else(|| {
                        Error::invalid_data(
                            WHAT,
                            format!(
                                "field '{}': variadic buffer count {count} with {} buffer(s)",
                                field.name(),
                                layout.buffers.len()
                            ),
                        )
                    })?;
                at.1 += count;
            }
            if at.0 > layout.nodes.len() || at.1 > layout.buffers.len() {
                return Err(Error::invalid_data(
                    WHAT,
                    format!(
                        "field '{}' needs more than the message's {} field node(s) and {} buffer(s)",
                        field.name(),
                        layout.nodes.len(),
                        layout.buffers.len()
                    ),
                ));
            }
            for child in &type_layout.children {
                walk(layout, child, version, at)?;
            }
            Ok(())
        }
        let mut at = (0, 0, 0);
        let mut extents = Vec::with_capacity(fields.len());
        for field in fields.iter() {
            let start = at;
            walk(self, field, version, &mut at)?;
            extents.push(FieldExtent {
                nodes: start.0..at.0,
                buffers: start.1..at.1,
                variadic_counts: start.2..at.2,
            });
        }
        Ok(extents)
    }

    /// The layout of the fields `extents` (in that order) alone.
    pub(crate) fn select(&self, extents: &[&FieldExtent]) -> BatchLayout {
        let mut out = BatchLayout::default();
        for extent in extents {
            out.nodes
                .extend_from_slice(&self.nodes[extent.nodes.clone()]);
            out.buffers
                .extend_from_slice(&self.buffers[extent.buffers.clone()]);
            out.variadic_counts
                .extend_from_slice(&self.variadic_counts[extent.variadic_counts.clone()]);
        }
        out
    }
}

/// Refuse a compressed body where the caller reads the message's own layout (the body is
/// sliced in place on the device).
fn refuse_compressed(batch: ipc::RecordBatch<'_>) -> Result<()> {
    if let Some(compression) = batch.compression() {
        return Err(Error::unsupported(
            "reading a compressed Arrow IPC body",
            format!(
                "the body is compressed ({:?}); a single message is read in place on the device, which cannot decompress it: read the data with DeviceStreamReader or DeviceFileReader (they decompress on the host), or write without compression",
                compression.codec()
            ),
        ));
    }
    Ok(())
}

/// The row count of a record batch message.
pub(crate) fn row_count(batch: ipc::RecordBatch<'_>) -> Result<usize> {
    usize::try_from(batch.length())
        .map_err(|_| Error::invalid_data(WHAT, format!("negative row count {}", batch.length())))
}

/// Decode a record batch message whose body is `body`. With `layout` `None` the
/// message's own layout is used (and a compressed body refused); a reader that rewrote
/// the body (projected, decompressed) passes the layout of the body it made, and `fields`
/// and `ids` of the columns it kept.
pub(crate) fn decode_record_batch(
    batch: ipc::RecordBatch<'_>,
    layout: Option<BatchLayout>,
    body: &DeviceBuffer,
    version: MetadataVersion,
    fields: &Fields,
    ids: &DictionaryIds,
    dictionaries: &Dictionaries,
) -> Result<Decoded> {
    let num_rows = row_count(batch)?;
    let layout = match layout {
        Some(layout) => layout,
        None => {
            refuse_compressed(batch)?;
            BatchLayout::of(batch)
        }
    };
    let mut decoder = Decoder::new(layout, body, version, ids, dictionaries);
    let mut columns = Vec::with_capacity(fields.len());
    let mut path = Vec::new();
    for (i, field) in fields.iter().enumerate() {
        path.push(i);
        let column = decoder.decode_field(field, &mut path)?;
        path.pop();
        if column.len != num_rows {
            return Err(Error::invalid_data(
                WHAT,
                format!(
                    "column '{}' has {} rows, the batch {num_rows}",
                    field.name(),
                    column.len
                ),
            ));
        }
        columns.push(column);
    }
    decoder.finish()?;
    Ok(Decoded {
        num_rows,
        columns,
        dictionary_bodies: decoder.used_bodies,
    })
}

/// Decode a dictionary batch message whose body is `body`: its id and its values.
///
/// # Errors
/// [`Error::Unsupported`] for a delta dictionary; [`Error::InvalidData`] for an id no
/// field of the schema uses, and as [`decode_record_batch`].
pub(crate) fn decode_dictionary_batch(
    batch: ipc::DictionaryBatch<'_>,
    layout: Option<BatchLayout>,
    body: &DeviceBuffer,
    version: MetadataVersion,
    fields: &Fields,
    ids: &DictionaryIds,
    dictionaries: &Dictionaries,
) -> Result<(i64, DictionaryEntry)> {
    let id = batch.id();
    if batch.isDelta() {
        return Err(Error::unsupported(
            "reading a delta dictionary batch",
            format!(
                "dictionary {id} is a delta; cudabuf keeps each dictionary as zero-copy slices of one message body and cannot append to it on the device (write the stream with DictionaryHandling::Resend, arrow-rs's default)"
            ),
        ));
    }
    let (path, value_type) = ids
        .iter()
        .filter(|(_, &i)| i == id)
        .find_map(|(path, _)| match field_at(fields, path)?.data_type() {
            DataType::Dictionary(_, values) => Some((path.clone(), (**values).clone())),
            _ => None,
        })
        .ok_or_else(|| {
            Error::invalid_data(
                "Arrow IPC dictionary batch",
                format!("dictionary id {id} is not used by any field of the schema"),
            )
        })?;
    let data = batch.data().ok_or_else(|| {
        Error::invalid_data(
            "Arrow IPC dictionary batch",
            format!("dictionary {id} has no record batch"),
        )
    })?;
    let num_rows = row_count(data)?;
    let layout = match layout {
        Some(layout) => layout,
        None => {
            refuse_compressed(data)?;
            BatchLayout::of(data)
        }
    };
    let mut decoder = Decoder::new(layout, body, version, ids, dictionaries);
    let field = Field::new("values", value_type, true);
    let mut path = path;
    let values = decoder.decode_field(&field, &mut path)?;
    decoder.finish()?;
    if values.len != num_rows {
        return Err(Error::invalid_data(
            WHAT,
            format!(
                "dictionary {id} has {} values, its batch {num_rows}",
                values.len
            ),
        ));
    }
    let mut bodies = vec![body.clone()];
    bodies.extend(decoder.used_bodies);
    Ok((
        id,
        DictionaryEntry {
            values: Arc::new(values),
            bodies,
        },
    ))
}

struct Decoder<'a> {
    /// Field nodes `(length, null_count)`, in order.
    nodes: VecDeque<(i64, i64)>,
    /// Buffer descriptors `(offset, length)`, in order.
    buffers: VecDeque<(i64, i64)>,
    variadic_counts: VecDeque<i64>,
    body: &'a DeviceBuffer,
    version: MetadataVersion,
    ids: &'a DictionaryIds,
    dictionaries: &'a Dictionaries,
    used_bodies: Vec<DeviceBuffer>,
}

impl<'a> Decoder<'a> {
    fn new(
        layout: BatchLayout,
        body: &'a DeviceBuffer,
        version: MetadataVersion,
        ids: &'a DictionaryIds,
        dictionaries: &'a Dictionaries,
    ) -> Self {
        Decoder {
            nodes: layout.nodes.into(),
            buffers: layout.buffers.into(),
            variadic_counts: layout.variadic_counts.into(),
            body,
            version,
            ids,
            dictionaries,
            used_bodies: Vec::new(),
        }
    }

    /// Every node and buffer must have been used.
    fn finish(&self) -> Result<()> {
        if !self.nodes.is_empty() || !self.buffers.is_empty() || !self.variadic_counts.is_empty() {
            return Err(Error::invalid_data(
                WHAT,
                format!(
                    "{} field node(s), {} buffer(s) and {} variadic count(s) left over after the schema's fields",
                    self.nodes.len(),
                    self.buffers.len(),
                    self.variadic_counts.len()
                ),
            ));
        }
        Ok(())
    }

    fn next_node(&mut self, field: &Field) -> Result<(usize, usize)> {
        let (length, null_count) = self.nodes.pop_front().ok_or_else(|| {
            Error::invalid_data(
                WHAT,
                format!("no field node left for field '{}'", field.name()),
            )
        })?;
        match (usize::try_from(length), usize::try_from(null_count)) {
            (Ok(len), Ok(nulls)) if nulls <= len => Ok((len, nulls)),
            _ => Err(Error::invalid_data(
                WHAT,
                format!(
                    "field '{}': invalid field node (length {length}, null count {null_count})",
                    field.name()
                ),
            )),
        }
    }

    fn next_buffer(&mut self, field: &Field) -> Result<DeviceBuffer> {
        let (offset, length) = self.buffers.pop_front().ok_or_else(|| {
            Error::invalid_data(
                WHAT,
                format!("no buffer descriptor left for field '{}'", field.name()),
            )
        })?;
        let fits = match (usize::try_from(offset), usize::try_from(length)) {
            (Ok(o), Ok(l)) => o.checked_add(l).is_some_and(|end| end <= self.body.size()),
            _ => false,
        };
        if !fits {
            return Err(Error::invalid_data(
                WHAT,
                format!(
                    "field '{}': buffer at offset {offset} of length {length} lies outside the {}-byte body",
                    field.name(),
                    self.body.size()
                ),
            ));
        }
        self.body.slice(offset as usize, length as usize)
    }

    fn check_size(
        field: &Field,
        what: &str,
        buffer: &DeviceBuffer,
        needed: Option<usize>,
    ) -> Result<()> {
        match needed {
            Some(needed) if buffer.size() >= needed => Ok(()),
            _ => Err(Error::invalid_data(
                WHAT,
                format!(
                    "field '{}': {what} buffer of {} bytes is too short for its length ({} bytes needed)",
                    field.name(),
                    buffer.size(),
                    needed.map_or_else(|| "more than usize::MAX".into(), |n| n.to_string())
                ),
            )),
        }
    }

    fn decode_field(&mut self, field: &Field, path: &mut FieldPath) -> Result<DeviceArray> {
        let data_type = field.data_type();
        let layout = type_layout(data_type)?;
        let (len, null_count) = self.next_node(field)?;

        if matches!(data_type, DataType::Null) && null_count != len {
            return Err(Error::invalid_data(
                WHAT,
                format!(
                    "field '{}': a Null array of length {len} has null count {null_count}",
                    field.name()
                ),
            ));
        }
        let v4_union_validity =
            self.version < MetadataVersion::V5 && matches!(data_type, DataType::Union(..));
        let mut nulls = None;
        if layout.validity || v4_union_validity {
            let bitmap = self.next_buffer(field)?;
            if layout.validity && null_count > 0 {
                Self::check_size(field, "validity", &bitmap, Some(len.div_ceil(8)))?;
                nulls = Some(bitmap);
            }
        }

        let mut buffers = Vec::with_capacity(layout.buffers.len());
        for kind in &layout.buffers {
            let buffer = self.next_buffer(field)?;
            if *kind != BufferKind::Data {
                Self::check_size(field, "data", &buffer, kind.min_size(len))?;
            }
            buffers.push(buffer);
        }
        if layout.variadic {
            let count = self.variadic_counts.pop_front().ok_or_else(|| {
                Error::invalid_data(
                    WHAT,
                    format!("field '{}': no variadic buffer count", field.name()),
                )
            })?;
            let count = usize::try_from(count)
                .ok()
                .filter(|&c| c <= self.buffers.len())
                .ok_or_else(|| {
                    Error::invalid_data(
                        WHAT,
                        format!(
                            "field '{}': variadic buffer count {count} with {} buffer(s) left",
                            field.name(),
                            self.buffers.len()
                        ),
                    )
                })?;
            for _ in 0..count {
                buffers.push(self.next_buffer(field)?);
            }
        }

        let mut children = Vec::with_capacity(layout.children.len());
        for (i, child_field) in layout.children.iter().enumerate() {
            path.push(i);
            let child = self.decode_field(child_field, path)?;
            path.pop();
            if let Some(min) = min_child_len(data_type, len) {
                if child.len < min {
                    return Err(Error::invalid_data(
                        WHAT,
                        format!(
                            "field '{}': child '{}' has {} elements, at least {min} needed",
                            field.name(),
                            child_field.name(),
                            child.len
                        ),
                    ));
                }
            }
            children.push(child);
        }

        let dictionary = match data_type {
            DataType::Dictionary(..) => Some(self.dictionary_for(field, path)?),
            _ => None,
        };

        Ok(DeviceArray {
            data_type: data_type.clone(),
            len,
            offset: 0,
            null_count,
            nulls,
            buffers,
            children,
            dictionary,
        })
    }

    fn dictionary_for(&mut self, field: &Field, path: &FieldPath) -> Result<Arc<DeviceArray>> {
        let id = self.ids.get(path).copied().ok_or_else(|| {
            Error::invalid_argument(
                "read_record_batch",
                format!(
                    "field '{}' is dictionary-encoded, but its dictionary is not known here: read dictionary-encoded data as a stream with DeviceStreamReader",
                    field.name()
                ),
            )
        })?;
        let entry = self.dictionaries.get(&id).ok_or_else(|| {
            Error::invalid_data(
                WHAT,
                format!(
                    "field '{}' uses dictionary {id}, which no earlier dictionary batch of the stream defined",
                    field.name()
                ),
            )
        })?;
        for body in &entry.bodies {
            let known = self
                .used_bodies
                .iter()
                .any(|b| b.address() == body.address() && b.size() == body.size());
            if !known {
                self.used_bodies.push(body.clone());
            }
        }
        Ok(entry.values.clone())
    }
}
