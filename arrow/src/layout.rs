//! The physical layout of each Arrow type: which buffers an array has, how big they
//! must be, and which child arrays it has. Shared by the IPC decoder, the host copy and
//! the C Device Data Interface, so the three cannot disagree.

use arrow::datatypes::{DataType, FieldRef, Fields, UnionMode};
use cudabuf_core::{Error, Result};

/// How one buffer (other than the validity bitmap) of an array is sized, from the number
/// of slots `n` (the array's offset plus its length).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BufferKind {
    /// A bitmap of values (`Boolean`): `ceil(n / 8)` bytes.
    Bits,
    /// `n * width` bytes (primitives, fixed-size binary, view structs, type ids, union
    /// and list-view offsets and sizes).
    Fixed(usize),
    /// `(n + 1) * width` bytes of offsets (variable-size binary and lists); width 4 or 8.
    Offsets(usize),
    /// Variable-size data whose size is the last offset of the preceding offsets buffer.
    Data,
}

impl BufferKind {
    /// The minimum size in bytes for `n` slots (`Data`: 0, its size comes from the
    /// offsets). `None` on overflow.
    pub(crate) fn min_size(self, n: usize) -> Option<usize> {
        match self {
            BufferKind::Bits => Some(n.div_ceil(8)),
            BufferKind::Fixed(width) => n.checked_mul(width),
            BufferKind::Offsets(_) if n == 0 => Some(0),
            BufferKind::Offsets(width) => n.checked_add(1)?.checked_mul(width),
            BufferKind::Data => Some(0),
        }
    }
}

/// The layout of one Arrow type.
#[derive(Debug, Clone)]
pub(crate) struct TypeLayout {
    /// Whether the type has a validity bitmap (every type but `Null`, unions and
    /// run-end-encoded, as in IPC metadata V5 and the C Data Interface).
    pub(crate) validity: bool,
    /// The buffers after the validity bitmap, in `ArrayData::buffers` order.
    pub(crate) buffers: Vec<BufferKind>,
    /// The fields of the child arrays, in `ArrayData::child_data` order (the
    /// dictionary of a dictionary-encoded type is not a child).
    pub(crate) children: Vec<FieldRef>,
    /// Whether variadic data buffers follow (`Utf8View`, `BinaryView`).
    pub(crate) variadic: bool,
}

impl TypeLayout {
    fn new(validity: bool, buffers: Vec<BufferKind>, children: Vec<FieldRef>) -> Self {
        TypeLayout {
            validity,
            buffers,
            children,
            variadic: false,
        }
    }
}

/// The layout of `data_type`.
///
/// # Errors
/// [`Error::Unsupported`] for a type cudabuf cannot lay out (a dictionary with a
/// non-integer key, a negative fixed size).
pub(crate) fn type_layout(data_type: &DataType) -> Result<TypeLayout> {
    use BufferKind::*;
    if let Some(width) = data_type.primitive_width() {
        return Ok(TypeLayout::new(true, vec![Fixed(width)], vec![]));
    }
    let layout = match data_type {
        DataType::Null => TypeLayout::new(false, vec![], vec![]),
        DataType::Boolean => TypeLayout::new(true, vec![Bits], vec![]),
        DataType::FixedSizeBinary(width) => {
            let width = usize::try_from(*width).map_err(|_| {
                Error::unsupported(
                    "Arrow layout",
                    format!("FixedSizeBinary with negative width {width}"),
                )
            })?;
            TypeLayout::new(true, vec![Fixed(width)], vec![])
        }
        DataType::Utf8 | DataType::Binary => TypeLayout::new(true, vec![Offsets(4), Data], vec![]),
        DataType::LargeUtf8 | DataType::LargeBinary => {
            TypeLayout::new(true, vec![Offsets(8), Data], vec![])
        }
        DataType::Utf8View | DataType::BinaryView => TypeLayout {
            validity: true,
            buffers: vec![Fixed(16)],
            children: vec![],
            variadic: true,
        },
        DataType::List(f) | DataType::Map(f, _) => {
            TypeLayout::new(true, vec![Offsets(4)], vec![f.clone()])
        }
        DataType::LargeList(f) => TypeLayout::new(true, vec![Offsets(8)], vec![f.clone()]),
        DataType::ListView(f) => TypeLayout::new(true, vec![Fixed(4), Fixed(4)], vec![f.clone()]),
        DataType::LargeListView(f) => {
            TypeLayout::new(true, vec![Fixed(8), Fixed(8)], vec![f.clone()])
        }
        DataType::FixedSizeList(f, _) => TypeLayout::new(true, vec![], vec![f.clone()]),
        DataType::Struct(fields) => TypeLayout::new(true, vec![], fields.iter().cloned().collect()),
        DataType::Union(fields, mode) => TypeLayout::new(
            false,
            match mode {
                UnionMode::Sparse => vec![Fixed(1)],
                UnionMode::Dense => vec![Fixed(1), Fixed(4)],
            },
            fields.iter().map(|(_, f)| f.clone()).collect(),
        ),
        DataType::Dictionary(key, _) => {
            let width = key
                .is_dictionary_key_type()
                .then(|| key.primitive_width())
                .flatten()
                .ok_or_else(|| {
                    Error::unsupported(
                        "Arrow layout",
                        format!("dictionary with non-integer key type {key}"),
                    )
                })?;
            TypeLayout::new(true, vec![Fixed(width)], vec![])
        }
        DataType::RunEndEncoded(run_ends, values) => {
            TypeLayout::new(false, vec![], vec![run_ends.clone(), values.clone()])
        }
        other => {
            return Err(Error::unsupported(
                "Arrow layout",
                format!("data type {other} is not supported"),
            ))
        }
    };
    Ok(layout)
}

/// Whether a schema's `fields` are ones cudabuf can read: every type, nested ones and
/// dictionary values included, has a layout, and is one arrow-rs can build arrays of (it
/// panics building even an empty array of the types refused here).
///
/// # Errors
/// [`Error::InvalidData`] for a negative fixed size (`FixedSizeBinary`,
/// `FixedSizeList`), run ends of a type other than Int16, Int32 or Int64, map entries
/// that are not a struct of two fields; [`Error::Unsupported`] for a type without a
/// layout (a dictionary with a non-integer key).
pub(crate) fn check_fields(what: &'static str, fields: &Fields) -> Result<()> {
    fn check(what: &'static str, name: &str, data_type: &DataType) -> Result<()> {
        match data_type {
            DataType::FixedSizeBinary(n) | DataType::FixedSizeList(_, n) if *n < 0 => {
                return Err(Error::invalid_data(
                    what,
                    format!("field {name:?} has a negative fixed size: {data_type}"),
                ))
            }
            DataType::Dictionary(_, values) => check(what, name, values)?,
            DataType::RunEndEncoded(run_ends, _)
                if !matches!(
                    run_ends.data_type(),
                    DataType::Int16 | DataType::Int32 | DataType::Int64
                ) =>
            {
                return Err(Error::invalid_data(
                    what,
                    format!(
                        "field {name:?} has run ends of type {}, not Int16, Int32 or Int64",
                        run_ends.data_type()
                    ),
                ))
            }
            DataType::Map(entries, _)
                if !matches!(entries.data_type(), DataType::Struct(f) if f.len() == 2) =>
            {
                return Err(Error::invalid_data(
                    what,
                    format!(
                        "field {name:?} is a map whose entries are {}, not a struct of a key and a value",
                        entries.data_type()
                    ),
                ))
            }
            _ => {}
        }
        type_layout(data_type)?;
        nested_fields(data_type)
            .into_iter()
            .try_for_each(|f| check(what, f.name(), f.data_type()))
    }
    fields
        .iter()
        .try_for_each(|f| check(what, f.name(), f.data_type()))
}

/// The fields nested directly in `data_type`, in the order IPC schemas list them as a
/// field's children (for a dictionary type: those of its value type).
pub(crate) fn nested_fields(data_type: &DataType) -> Vec<&FieldRef> {
    match data_type {
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::ListView(f)
        | DataType::LargeListView(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => vec![f],
        DataType::Struct(fields) => fields.iter().collect(),
        DataType::Union(fields, _) => fields.iter().map(|(_, f)| f).collect(),
        DataType::RunEndEncoded(run_ends, values) => vec![run_ends, values],
        DataType::Dictionary(_, values) => nested_fields(values),
        _ => vec![],
    }
}

/// The length in slots of child `index` of an array of `data_type` with `n` slots, where
/// it follows from the parent (struct, sparse union, fixed-size list); `None` where the
/// child's length is independent (lists, dense unions, run-end encoded). A length too
/// large for `usize` is `usize::MAX` (no child has that many slots, so the check fails
/// instead of being skipped); a negative list size gives no minimum (arrow-rs refuses
/// the type).
pub(crate) fn min_child_len(data_type: &DataType, n: usize) -> Option<usize> {
    match data_type {
        DataType::Struct(_) | DataType::Union(_, UnionMode::Sparse) => Some(n),
        DataType::FixedSizeList(_, size) => Some(usize::try_from(*size).ok()?.saturating_mul(n)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow::datatypes::Field;

    #[test]
    fn schemas_arrow_rs_cannot_build_arrays_of_are_invalid_data() {
        let field = |dt: DataType| Arc::new(Field::new("f", dt, true));
        let bad_binary = DataType::FixedSizeBinary(-1);
        let bad_list = DataType::FixedSizeList(field(DataType::Int8), -3);
        for dt in [
            bad_binary.clone(),
            bad_list.clone(),
            DataType::List(field(bad_binary.clone())),
            DataType::Struct(vec![field(DataType::Int8), field(bad_list)].into()),
            DataType::Dictionary(Box::new(DataType::Int32), Box::new(bad_binary.clone())),
            DataType::Map(
                field(DataType::Struct(
                    vec![field(DataType::Utf8), field(bad_binary)].into(),
                )),
                false,
            ),
        ] {
            let fields = Fields::from(vec![
                Field::new("ok", DataType::Int64, false),
                Field::new("x", dt.clone(), true),
            ]);
            let err = check_fields("test", &fields).unwrap_err();
            assert_eq!(
                err.kind(),
                cudabuf_core::ErrorKind::InvalidData,
                "{dt}: {err}"
            );
            assert!(err.to_string().contains("negative fixed size"), "{err}");
        }
        let run_ends_utf8 = DataType::RunEndEncoded(
            Arc::new(Field::new("run_ends", DataType::Utf8, false)),
            field(DataType::Int32),
        );
        let map_of_ints = DataType::Map(field(DataType::Int32), false);
        let map_of_one = DataType::Map(
            Arc::new(Field::new(
                "entries",
                DataType::Struct(vec![field(DataType::Utf8)].into()),
                false,
            )),
            false,
        );
        for (dt, says) in [
            (run_ends_utf8.clone(), "run ends of type Utf8"),
            (
                DataType::List(field(run_ends_utf8)),
                "run ends of type Utf8",
            ),
            (map_of_ints, "not a struct of a key and a value"),
            (map_of_one, "not a struct of a key and a value"),
        ] {
            let fields = Fields::from(vec![Field::new("x", dt.clone(), true)]);
            let err = check_fields("test", &fields).unwrap_err();
            assert_eq!(
                err.kind(),
                cudabuf_core::ErrorKind::InvalidData,
                "{dt}: {err}"
            );
            assert!(err.to_string().contains(says), "{err}");
            // What arrow-rs does with it: a panic building an empty array.
            let built = std::panic::catch_unwind(|| arrow::array::new_empty_array(&dt));
            assert!(
                built.is_err(),
                "{dt}: arrow-rs builds it, so it need not be refused"
            );
        }
        let good = Fields::from(vec![
            Field::new("b", DataType::FixedSizeBinary(0), true),
            Field::new(
                "r",
                DataType::RunEndEncoded(
                    Arc::new(Field::new("run_ends", DataType::Int16, false)),
                    field(DataType::Utf8),
                ),
                true,
            ),
            Field::new(
                "m",
                DataType::Map(
                    Arc::new(Field::new(
                        "entries",
                        DataType::Struct(
                            vec![
                                Arc::new(Field::new("k", DataType::Utf8, false)),
                                field(DataType::Int64),
                            ]
                            .into(),
                        ),
                        false,
                    )),
                    false,
                ),
                true,
            ),
            Field::new(
                "l",
                DataType::FixedSizeList(field(DataType::Float32), 4),
                true,
            ),
            Field::new(
                "d",
                DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
                true,
            ),
        ]);
        check_fields("test", &good).unwrap();
        let float_key = Fields::from(vec![Field::new(
            "d",
            DataType::Dictionary(Box::new(DataType::Float32), Box::new(DataType::Utf8)),
            true,
        )]);
        assert_eq!(
            check_fields("test", &float_key).unwrap_err().kind(),
            cudabuf_core::ErrorKind::Unsupported
        );
    }

    #[test]
    fn min_child_len_of_a_huge_fixed_size_list_fails_every_child() {
        let item = Arc::new(Field::new("item", DataType::Int8, true));
        let list = DataType::FixedSizeList(item, 1 << 20);
        assert_eq!(min_child_len(&list, 3), Some(3 << 20));
        assert_eq!(min_child_len(&list, usize::MAX / 2), Some(usize::MAX));
        assert_eq!(min_child_len(&DataType::Utf8, 3), None);
    }

    #[test]
    fn layouts_match_arrow_rs_buffer_counts() {
        let list = DataType::List(Arc::new(Field::new("item", DataType::Int32, true)));
        for (dt, buffers) in [
            (DataType::Int64, 1),
            (DataType::Boolean, 1),
            (DataType::Utf8, 2),
            (DataType::Null, 0),
            (list, 1),
            (
                DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Utf8)),
                1,
            ),
        ] {
            let layout = type_layout(&dt).unwrap();
            assert_eq!(layout.buffers.len(), buffers, "{dt}");
            assert_eq!(
                layout.buffers.len(),
                arrow::array::layout(&dt).buffers.len(),
                "{dt}"
            );
        }
    }

    #[test]
    fn min_sizes() {
        assert_eq!(BufferKind::Bits.min_size(9), Some(2));
        assert_eq!(BufferKind::Offsets(4).min_size(0), Some(0));
        assert_eq!(BufferKind::Offsets(4).min_size(3), Some(16));
        assert_eq!(BufferKind::Fixed(8).min_size(usize::MAX), None);
    }
}
