//! Record batches the cases serialize, and arrow-rs's own host encodings of them.

use std::sync::Arc;

use arrow::array::*;
use arrow::buffer::{NullBuffer, ScalarBuffer};
use arrow::datatypes::*;
use arrow::ipc::writer::{
    write_message, DictionaryHandling, DictionaryTracker, IpcDataGenerator, IpcWriteContext,
    IpcWriteOptions, StreamWriter,
};
use arrow::record_batch::RecordBatch;

pub(crate) fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    RecordBatch::try_from_iter(columns).expect("test batch")
}

pub(crate) fn ints() -> ArrayRef {
    Arc::new(Int32Array::from(vec![
        Some(1),
        None,
        Some(-3),
        Some(i32::MAX),
        None,
        Some(0),
    ]))
}

pub(crate) fn floats() -> ArrayRef {
    Arc::new(Float64Array::from(vec![
        Some(1.5),
        None,
        Some(-0.25),
        Some(f64::INFINITY),
        Some(1e300),
        None,
    ]))
}

pub(crate) fn bools() -> ArrayRef {
    Arc::new(BooleanArray::from(vec![
        Some(true),
        None,
        Some(false),
        Some(true),
        Some(true),
        None,
        Some(false),
        Some(true),
        Some(false),
        Some(false),
        None,
        Some(true),
        Some(true),
    ]))
}

pub(crate) fn strings() -> ArrayRef {
    Arc::new(StringArray::from(vec![
        Some("hello"),
        None,
        Some(""),
        Some("déjà vu"),
        Some(&*"x".repeat(100)),
        None,
    ]))
}

pub(crate) fn list() -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
        Some(vec![Some(1), None]),
        None,
        Some(vec![]),
        Some(vec![Some(4), Some(5), Some(6)]),
        Some(vec![Some(7)]),
    ]))
}

pub(crate) fn structs() -> ArrayRef {
    let fields = Fields::from(vec![
        Field::new("a", DataType::Int32, true),
        Field::new("b", DataType::Utf8, true),
    ]);
    let a = Arc::new(Int32Array::from(vec![Some(1), Some(2), None, Some(4)])) as ArrayRef;
    let b = Arc::new(StringArray::from(vec![
        Some("p"),
        None,
        Some("r"),
        Some("s"),
    ])) as ArrayRef;
    Arc::new(
        StructArray::try_new(
            fields,
            vec![a, b],
            Some(NullBuffer::from(vec![true, false, true, true])),
        )
        .expect("struct"),
    )
}

pub(crate) fn dictionary(values: &[Option<&str>]) -> ArrayRef {
    Arc::new(
        values
            .iter()
            .copied()
            .collect::<DictionaryArray<Int32Type>>(),
    )
}

/// Columns of many types (no dictionary), 5 rows.
pub(crate) fn mixed() -> RecordBatch {
    let n = 5;
    let fixed_list = FixedSizeListArray::try_new(
        Arc::new(Field::new("item", DataType::Int16, true)),
        2,
        Arc::new(Int16Array::from(vec![
            Some(1),
            Some(2),
            None,
            Some(4),
            Some(5),
            Some(6),
            Some(7),
            Some(8),
            Some(9),
            Some(10),
        ])),
        Some(NullBuffer::from(vec![true, true, false, true, true])),
    )
    .expect("fixed size list");
    let large_list = LargeListArray::from_iter_primitive::<Int64Type, _, _>(vec![
        Some(vec![Some(1)]),
        None,
        Some(vec![Some(2), Some(3)]),
        Some(vec![]),
        Some(vec![None]),
    ]);
    let sparse = UnionArray::try_new(
        UnionFields::try_new(
            vec![0, 1],
            vec![
                Field::new("i", DataType::Int32, true),
                Field::new("s", DataType::Utf8, true),
            ],
        )
        .expect("union fields"),
        ScalarBuffer::from(vec![0i8, 1, 0, 1, 0]),
        None,
        vec![
            Arc::new(Int32Array::from(vec![
                Some(1),
                None,
                Some(3),
                None,
                Some(5),
            ])),
            Arc::new(StringArray::from(vec![
                None,
                Some("b"),
                None,
                Some("d"),
                None,
            ])),
        ],
    )
    .expect("sparse union");
    let dense = UnionArray::try_new(
        UnionFields::try_new(
            vec![3, 7],
            vec![
                Field::new("f", DataType::Float32, true),
                Field::new("b", DataType::Boolean, true),
            ],
        )
        .expect("union fields"),
        ScalarBuffer::from(vec![3i8, 7, 7, 3, 3]),
        Some(ScalarBuffer::from(vec![0i32, 0, 1, 1, 2])),
        vec![
            Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0])),
            Arc::new(BooleanArray::from(vec![true, false])),
        ],
    )
    .expect("dense union");
    let mut map = MapBuilder::new(None, StringBuilder::new(), Int32Builder::new());
    for row in 0..n {
        for k in 0..row % 3 {
            map.keys().append_value(format!("k{k}"));
            map.values().append_option((k != 1).then_some(k as i32));
        }
        map.append(row != 2).expect("map row");
    }
    let run_ends = RunArray::<Int32Type>::try_new(
        &Int32Array::from(vec![2, 3, 5]),
        &StringArray::from(vec![Some("run"), None, Some("end")]),
    )
    .expect("run array");
    let list_view = ListViewArray::new(
        Arc::new(Field::new("item", DataType::Int32, true)),
        ScalarBuffer::from(vec![0i32, 2, 1, 0, 3]),
        ScalarBuffer::from(vec![2i32, 1, 2, 0, 1]),
        Arc::new(Int32Array::from(vec![10, 11, 12, 13])),
        Some(NullBuffer::from(vec![true, true, false, true, true])),
    );
    batch(vec![
        (
            "i8",
            Arc::new(Int8Array::from(vec![
                Some(-1),
                None,
                Some(2),
                Some(3),
                Some(4),
            ])),
        ),
        (
            "u64",
            Arc::new(UInt64Array::from(vec![u64::MAX, 0, 1, 2, 3])),
        ),
        (
            "f16",
            arrow::compute::cast(
                &Float32Array::from(vec![None, Some(1.0), Some(-2.5), None, Some(0.0)]),
                &DataType::Float16,
            )
            .expect("cast to f16"),
        ),
        (
            "f32",
            Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0, 4.0, 5.0])),
        ),
        (
            "decimal",
            Arc::new(
                Decimal128Array::from(vec![Some(12345), None, Some(-1), Some(0), Some(i128::MAX)])
                    .with_precision_and_scale(38, 2)
                    .expect("decimal"),
            ),
        ),
        (
            "ts",
            Arc::new(
                TimestampMicrosecondArray::from(vec![Some(1), None, Some(3), Some(4), Some(5)])
                    .with_timezone("UTC"),
            ),
        ),
        (
            "date",
            Arc::new(Date32Array::from(vec![
                Some(1),
                Some(2),
                None,
                Some(4),
                Some(5),
            ])),
        ),
        ("null", Arc::new(NullArray::new(n))),
        (
            "bool",
            Arc::new(BooleanArray::from(vec![true, false, true, true, false])),
        ),
        (
            "large_utf8",
            Arc::new(LargeStringArray::from(vec![
                Some("a"),
                None,
                Some("ccc"),
                Some(""),
                Some("e"),
            ])),
        ),
        (
            "binary",
            Arc::new(BinaryArray::from(vec![
                Some(&b"\x00\x01"[..]),
                None,
                Some(b""),
                Some(b"xyz"),
                Some(b"!"),
            ])),
        ),
        (
            "fixed_binary",
            Arc::new(
                FixedSizeBinaryArray::try_from_sparse_iter_with_size(
                    vec![Some(b"abc"), None, Some(b"def"), Some(b"ghi"), None].into_iter(),
                    3,
                )
                .expect("fixed binary"),
            ),
        ),
        ("fixed_list", Arc::new(fixed_list)),
        ("large_list", Arc::new(large_list)),
        ("sparse_union", Arc::new(sparse)),
        ("dense_union", Arc::new(dense)),
        ("map", Arc::new(map.finish())),
        ("run_end", Arc::new(run_ends)),
        ("list_view", Arc::new(list_view)),
        (
            "utf8_view",
            Arc::new(StringViewArray::from(vec![
                Some("short"),
                None,
                Some("a string longer than twelve bytes"),
                Some(""),
                Some("another long string for the data buffer"),
            ])),
        ),
    ])
}

/// `mixed()` without the types the C Device Data Interface export does not take.
pub(crate) fn mixed_without_views() -> RecordBatch {
    let full = mixed();
    let keep: Vec<usize> = full
        .schema()
        .fields()
        .iter()
        .enumerate()
        .filter(|(_, f)| !matches!(f.data_type(), DataType::Utf8View | DataType::BinaryView))
        .map(|(i, _)| i)
        .collect();
    full.project(&keep).expect("projection")
}

/// A batch of `rows` rows of an int64, a float64 and a short-string column.
pub(crate) fn large(rows: usize) -> RecordBatch {
    batch(vec![
        ("id", Arc::new(Int64Array::from_iter_values(0..rows as i64))),
        (
            "value",
            Arc::new(Float64Array::from_iter_values(
                (0..rows).map(|i| i as f64 * 0.5),
            )),
        ),
        (
            "tag",
            Arc::new(StringArray::from_iter_values(
                (0..rows).map(|i| ["a", "bb", "ccc"][i % 3]),
            )),
        ),
    ])
}

/// arrow-rs's encapsulated IPC message for `batch` (IpcDataGenerator + write_message,
/// default options).
pub(crate) fn arrow_rs_message(batch: &RecordBatch) -> Vec<u8> {
    let options = IpcWriteOptions::default();
    let (_, encoded) = IpcDataGenerator::default()
        .encode(
            batch,
            &mut DictionaryTracker::new(false),
            &options,
            &mut IpcWriteContext::default(),
        )
        .expect("arrow-rs encode");
    let mut out = Vec::new();
    write_message(&mut out, encoded, &options).expect("arrow-rs write_message");
    out
}

/// arrow-rs's IPC stream of `batches` (StreamWriter, default options unless `delta`).
pub(crate) fn arrow_rs_stream(schema: &Schema, batches: &[RecordBatch], delta: bool) -> Vec<u8> {
    let mut options = IpcWriteOptions::default();
    if delta {
        options = options.with_dictionary_handling(DictionaryHandling::Delta);
    }
    let mut out = Vec::new();
    {
        let mut writer =
            StreamWriter::try_new_with_options(&mut out, schema, options).expect("stream writer");
        for batch in batches {
            writer.write(batch).expect("stream write");
        }
        writer.finish().expect("stream finish");
    }
    out
}

/// A stream schema with dictionary columns (one nested in a struct) and three batches:
/// the first two share their dictionaries, the third replaces one.
pub(crate) fn dictionary_stream() -> (SchemaRef, Vec<RecordBatch>) {
    let dict_type = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let inner = Fields::from(vec![
        Field::new("code", dict_type.clone(), true),
        Field::new("n", DataType::Int64, true),
    ]);
    let schema = Arc::new(Schema::new(vec![
        Field::new("city", dict_type.clone(), true),
        Field::new("x", DataType::Float64, true),
        Field::new("nested", DataType::Struct(inner.clone()), true),
    ]));
    let values: ArrayRef = Arc::new(StringArray::from(vec!["paris", "oslo", "lima"]));
    let codes: ArrayRef = Arc::new(StringArray::from(vec![Some("A"), Some("B"), None]));
    let make = |keys: Vec<Option<i32>>, values: &ArrayRef, codes: &ArrayRef, x: f64| {
        let n = keys.len();
        let city =
            DictionaryArray::<Int32Type>::try_new(Int32Array::from(keys.clone()), values.clone())
                .expect("dictionary");
        let code = DictionaryArray::<Int32Type>::try_new(
            Int32Array::from(
                keys.iter()
                    .map(|k| k.map(|k| (k + 1) % 2))
                    .collect::<Vec<_>>(),
            ),
            codes.clone(),
        )
        .expect("dictionary");
        let nested = StructArray::try_new(
            inner.clone(),
            vec![
                Arc::new(code) as ArrayRef,
                Arc::new(Int64Array::from_iter_values(0..n as i64)),
            ],
            None,
        )
        .expect("struct");
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(city),
                Arc::new(Float64Array::from_iter_values((0..n).map(|i| x + i as f64))),
                Arc::new(nested),
            ],
        )
        .expect("batch")
    };
    let replaced: ArrayRef = Arc::new(StringArray::from(vec!["tokyo", "accra"]));
    let batches = vec![
        make(vec![Some(0), Some(2), None, Some(1)], &values, &codes, 1.0),
        make(vec![Some(2), Some(2)], &values, &codes, 2.0),
        make(vec![Some(1), None, Some(0)], &replaced, &codes, 3.0),
    ];
    (schema, batches)
}

/// Two batches whose dictionary grows: arrow-rs writes the second one as a delta with
/// `DictionaryHandling::Delta`.
pub(crate) fn delta_stream() -> (SchemaRef, Vec<RecordBatch>) {
    let dict_type = DataType::Dictionary(Box::new(DataType::Int32), Box::new(DataType::Utf8));
    let schema = Arc::new(Schema::new(vec![Field::new("d", dict_type, true)]));
    let first = DictionaryArray::<Int32Type>::try_new(
        Int32Array::from(vec![0, 1]),
        Arc::new(StringArray::from(vec!["a", "b"])),
    )
    .expect("dictionary");
    let second = DictionaryArray::<Int32Type>::try_new(
        Int32Array::from(vec![2, 0]),
        Arc::new(StringArray::from(vec!["a", "b", "c"])),
    )
    .expect("dictionary");
    let batches = [first, second]
        .into_iter()
        .map(|d| RecordBatch::try_new(schema.clone(), vec![Arc::new(d)]).expect("batch"))
        .collect();
    (schema, batches)
}
