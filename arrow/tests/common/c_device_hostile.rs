//! Hostile producers: exported arrays whose numbers, buffer addresses, pointer arrays or
//! type lie (what only `unsafe` code, or a C producer, can make). Every import must be a
//! typed error, or an array whose host copy is a typed error or data; never a panic or an
//! access outside the producer's allocations; and the array is released exactly once.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, UnionFields, UnionMode};
use cudabuf_arrow::{export_device_array, import_device_array, ArrowArray, ArrowArrayParts};
use cudabuf_arrow::{ArrowDeviceArray, DeviceArray};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, ErrorKind};

use super::c_device::device_batches;
use super::c_device_edit::{count, count_releases, edit_node, Step};
use super::context;

/// The kinds an import or a host copy of a lying array may fail with.
const TYPED: [ErrorKind; 4] = [
    ErrorKind::InvalidData,
    ErrorKind::InvalidAddress,
    ErrorKind::InvalidArgument,
    ErrorKind::Unsupported,
];

/// Pointer arrays an edit made, kept alive until the array that points to them is released.
#[derive(Default)]
struct Keep {
    buffers: Vec<Vec<*const c_void>>,
    children: Vec<Vec<*mut ArrowArray>>,
}

impl Keep {
    fn buffers(&mut self, pointers: Vec<*const c_void>) -> *mut *const c_void {
        self.buffers.push(pointers);
        self.buffers.last_mut().unwrap().as_mut_ptr()
    }

    fn children(&mut self, pointers: Vec<*mut ArrowArray>) -> *mut *mut ArrowArray {
        self.children.push(pointers);
        self.children.last_mut().unwrap().as_mut_ptr()
    }
}

/// What the imports gave, by outcome.
#[derive(Default)]
struct Tally(BTreeMap<String, usize>);

impl Tally {
    fn add(&mut self, outcome: String) {
        *self.0.entry(outcome).or_default() += 1;
    }

    fn total(&self) -> usize {
        self.0.values().sum()
    }
}

/// Every node of an exported tree: its path from the root.
fn node_paths(array: &ArrowArray, path: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(path.clone());
    for i in 0..array.n_children().max(0) as usize {
        if let Some(child) = array.child(i) {
            path.push(Step::Child(i));
            node_paths(child, path, out);
            path.pop();
        }
    }
    if let Some(dictionary) = array.dictionary() {
        path.push(Step::Dictionary);
        node_paths(dictionary, path, out);
        path.pop();
    }
}

/// A lie told about one node: `edit` changes its parts (keeping every pointer array valid
/// for its count, with `Keep` holding the ones it makes).
type Lie = Box<dyn Fn(&mut ArrowArrayParts, &mut Keep)>;

/// Export `column`, apply `lie` at `path`, import it as `data_type`, and check the outcome.
fn import_lying(
    ctx: &Context,
    column: &DeviceArray,
    path: &[Step],
    data_type: &DataType,
    lie: &dyn Fn(&mut ArrowArrayParts, &mut Keep),
    what: &str,
    tally: &mut Tally,
) {
    let mut keep = Keep::default();
    let mut exported = export_device_array(column, ctx).unwrap();
    let releases = count_releases(&mut exported, &[]);
    // SAFETY: the lies keep the struct valid for what it claims to hold (pointer arrays
    // as long as their counts, `Keep` outliving the array); the numbers and device
    // addresses they change are what the import must check.
    unsafe { edit_node(&mut exported, path, |parts| lie(parts, &mut keep)) };
    check_import(ctx, &mut exported, data_type, what, tally);
    drop(exported);
    assert_eq!(count(&releases), 1, "{what}: released exactly once");
    drop(keep);
}

fn check_import(
    ctx: &Context,
    exported: &mut ArrowDeviceArray,
    data_type: &DataType,
    what: &str,
    tally: &mut Tally,
) {
    // SAFETY: a valid array of the interface (see the callers); the import trusts nothing
    // else.
    let imported = unsafe { import_device_array(exported, data_type, ctx) };
    assert!(exported.is_released(), "{what}: the import took the array");
    match imported {
        Ok(array) => match array.to_host() {
            Ok(_) => tally.add("imported, host copy made".into()),
            Err(e) => {
                assert!(TYPED.contains(&e.kind()), "{what}: to_host: {e}");
                tally.add(format!("imported, host copy {:?}", e.kind()));
            }
        },
        Err(e) => {
            assert!(TYPED.contains(&e.kind()), "{what}: {e}");
            tally.add(format!("import {:?}", e.kind()));
        }
    }
}

/// The lies told about a node with `length` slots, `n_buffers` buffers and `n_children`
/// children; `elsewhere` is a live device address of another column.
fn lies(length: i64, n_buffers: i64, n_children: i64, elsewhere: usize) -> Vec<(String, Lie)> {
    let mut lies: Vec<(String, Lie)> = Vec::new();
    let numbers = [
        0,
        1,
        length - 1,
        length + 1,
        2 * length + 7,
        1 << 40,
        i64::MAX / 2,
    ];
    let negative = [-1, -2, i64::MIN, i64::MAX];
    for v in numbers.into_iter().chain(negative).filter(|&v| v != length) {
        lies.push((format!("length {v}"), Box::new(move |p, _| p.length = v)));
    }
    for v in [1, length, length + 1, 1 << 40, i64::MAX - length.max(0)]
        .into_iter()
        .chain(negative)
    {
        lies.push((format!("offset {v}"), Box::new(move |p, _| p.offset = v)));
    }
    for v in [-1, 1, length + 1, i64::MAX, -2, i64::MIN] {
        lies.push((
            format!("null_count {v}"),
            Box::new(move |p, _| p.null_count = v),
        ));
    }
    // Fewer buffers or children than there are keeps the pointer arrays valid.
    for v in (0..n_buffers).chain([-1, i64::MIN]) {
        lies.push((
            format!("n_buffers {v}"),
            Box::new(move |p, _| p.n_buffers = v),
        ));
    }
    for v in (0..n_children).chain([-1, i64::MIN]) {
        lies.push((
            format!("n_children {v}"),
            Box::new(move |p, _| p.n_children = v),
        ));
    }
    if n_buffers > 0 {
        lies.push((
            "a null buffers array".into(),
            Box::new(|p, _| p.buffers = ptr::null_mut()),
        ));
        lies.push((
            "one buffer more (null)".into(),
            Box::new(|p, keep| {
                let mut pointers = buffers_of(p);
                pointers.push(ptr::null());
                p.n_buffers += 1;
                p.buffers = keep.buffers(pointers);
            }),
        ));
    }
    let host_address = &lies as *const _ as usize;
    for i in 0..n_buffers.max(0) as usize {
        for (name, address) in [
            ("null", Some(0)),
            ("+1", None),
            ("-1", None),
            ("+4096", None),
            ("8", Some(8)),
            ("u64::MAX - 7", Some(usize::MAX - 7)),
            ("u64::MAX", Some(usize::MAX)),
            ("a host address", Some(host_address)),
            ("another column's buffer", Some(elsewhere)),
        ] {
            lies.push((
                format!("buffer {i} at {name}"),
                Box::new(move |p, keep| {
                    let mut pointers = buffers_of(p);
                    let real = pointers[i] as usize;
                    let address = address.unwrap_or(match name {
                        "+1" => real.wrapping_add(1),
                        "-1" => real.wrapping_sub(1),
                        _ => real.wrapping_add(4096),
                    });
                    // Never dereferenced on the host: an address without provenance.
                    pointers[i] = ptr::without_provenance(address);
                    p.buffers = keep.buffers(pointers);
                }),
            ));
        }
    }
    if n_children > 0 {
        lies.push((
            "a null children array".into(),
            Box::new(|p, _| p.children = ptr::null_mut()),
        ));
        lies.push((
            "one child more (a copy of the first)".into(),
            Box::new(|p, keep| {
                let mut pointers = children_of(p);
                pointers.push(pointers[0]);
                p.n_children += 1;
                p.children = keep.children(pointers);
            }),
        ));
        lies.push((
            "the children reversed".into(),
            Box::new(|p, keep| {
                let mut pointers = children_of(p);
                pointers.reverse();
                p.children = keep.children(pointers);
            }),
        ));
        lies.push((
            "the first child as dictionary".into(),
            Box::new(|p, _| {
                if p.dictionary.is_null() {
                    p.dictionary = children_of(p)[0];
                }
            }),
        ));
    }
    lies.push((
        "no dictionary".into(),
        Box::new(|p, _| p.dictionary = ptr::null_mut()),
    ));
    lies
}

/// The node's buffer pointers, copied.
fn buffers_of(parts: &ArrowArrayParts) -> Vec<*const c_void> {
    // SAFETY: an unreleased node's `buffers` holds `n_buffers` pointers (the lies that
    // call this run on the node as exported).
    unsafe { std::slice::from_raw_parts(parts.buffers, parts.n_buffers as usize) }.to_vec()
}

/// The node's child pointers, copied.
fn children_of(parts: &ArrowArrayParts) -> Vec<*mut ArrowArray> {
    // SAFETY: as for `buffers_of`.
    unsafe { std::slice::from_raw_parts(parts.children, parts.n_children as usize) }.to_vec()
}

/// The fields of the node at `path` of an exported column.
fn node_at<'a>(root: &'a ArrowArray, path: &[Step]) -> &'a ArrowArray {
    path.iter().fold(root, |node, step| match step {
        Step::Child(i) => node.child(*i).unwrap(),
        Step::Dictionary => node.dictionary().unwrap(),
    })
}

pub(crate) fn c_device_import_of_lying_numbers_and_pointers_is_a_typed_error(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let mut tally = Tally::default();
    let batches = device_batches(&ctx);
    let elsewhere = batches[0].0.columns()[0].buffers()[0].address() as usize;
    for (device, host) in &batches {
        for (column, field) in device.columns().iter().zip(host.schema().fields()) {
            let probe = export_device_array(column, &ctx).unwrap();
            let mut paths = Vec::new();
            node_paths(probe.array(), &mut Vec::new(), &mut paths);
            for path in paths {
                let node = node_at(probe.array(), &path);
                let (length, n_buffers, n_children) =
                    (node.length(), node.n_buffers(), node.n_children());
                for (lie, edit) in lies(length, n_buffers, n_children, elsewhere) {
                    let what = format!("column '{}' node {path:?}: {lie}", field.name());
                    import_lying(
                        &ctx,
                        column,
                        &path,
                        field.data_type(),
                        &*edit,
                        &what,
                        &mut tally,
                    );
                }
            }
        }
    }
    println!("{} lying imports: {:?}", tally.total(), tally.0);
    assert!(tally.total() > 1000, "the lies were told");
    assert!(tally.0.keys().any(|k| k.starts_with("import InvalidData")));
    assert!(tally
        .0
        .keys()
        .any(|k| k.starts_with("import InvalidAddress")));
    drop(batches);
    assert_eq!(ctx.bytes_allocated(), 0, "nothing leaked");
    Ok(())
}

/// Types to import every column as: every type of the exported batches, and more.
fn types(
    batches: &[(
        cudabuf_arrow::DeviceRecordBatch,
        arrow::record_batch::RecordBatch,
    )],
) -> Vec<DataType> {
    let item = |t: DataType| Arc::new(Field::new("item", t, true));
    let mut types: Vec<DataType> = vec![
        DataType::Null,
        DataType::Int8,
        DataType::Int64,
        DataType::Boolean,
        DataType::Utf8,
        DataType::LargeBinary,
        DataType::List(item(DataType::Int32)),
        DataType::FixedSizeList(item(DataType::Int8), 1 << 30),
        DataType::FixedSizeList(item(DataType::Int64), 3),
        DataType::Struct(vec![Field::new("a", DataType::Int8, true)].into()),
        DataType::Struct(
            vec![
                Field::new("a", DataType::Utf8, true),
                Field::new("b", DataType::Int64, true),
            ]
            .into(),
        ),
        DataType::Dictionary(Box::new(DataType::Int8), Box::new(DataType::Int64)),
        DataType::Union(
            UnionFields::try_new(
                [0, 1],
                [
                    Field::new("a", DataType::Int32, true),
                    Field::new("b", DataType::Utf8, true),
                ],
            )
            .unwrap(),
            UnionMode::Sparse,
        ),
        DataType::Utf8View,
    ];
    for (_, host) in batches {
        for field in host.schema().fields() {
            if !types.contains(field.data_type()) {
                types.push(field.data_type().clone());
            }
        }
    }
    types
}

pub(crate) fn c_device_import_as_every_other_type_is_a_typed_error(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let mut tally = Tally::default();
    let batches = device_batches(&ctx);
    let types = types(&batches);
    for (device, host) in &batches {
        for (column, field) in device.columns().iter().zip(host.schema().fields()) {
            for data_type in types.iter().filter(|t| *t != field.data_type()) {
                let what = format!(
                    "column '{}' ({}) as {data_type}",
                    field.name(),
                    field.data_type()
                );
                import_lying(&ctx, column, &[], data_type, &|_, _| {}, &what, &mut tally);
            }
        }
    }
    println!("{} imports as another type: {:?}", tally.total(), tally.0);
    assert!(
        tally.total() > 500,
        "every column was imported as every type"
    );
    assert!(tally.0.keys().any(|k| k.starts_with("import InvalidData")));
    drop(batches);
    assert_eq!(ctx.bytes_allocated(), 0, "nothing leaked");
    Ok(())
}
