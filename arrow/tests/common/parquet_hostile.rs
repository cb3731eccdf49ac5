//! Hostile Parquet files, their footers and page headers written by hand: row counts
//! that lie, schemas nested too deep, and pages that declare more host memory than they
//! hold or than the reader allows. Each is a typed error before the `parquet` crate acts
//! on the lie, never a crash, wrong rows, or gigabytes of host memory.

use arrow::array::{Array, Int32Array, StructArray};
use cudabuf_arrow::{DeviceParquetReader, DEFAULT_PARQUET_DECOMPRESSION_LIMIT};
use cudabuf_conformance::{CaseResult, Fixture};
use cudabuf_core::{Context, Error, ErrorKind, FileOptions};

use super::context;
use super::files::TempFile;

// Thrift compact protocol, just enough to write footers and page headers.
const T_I32: u8 = 5;
const T_I64: u8 = 6;
const T_BINARY: u8 = 8;
const T_LIST: u8 = 9;
const T_STRUCT: u8 = 12;

struct Thrift {
    out: Vec<u8>,
    /// The last field id of each struct open, innermost last.
    last: Vec<i16>,
}

impl Thrift {
    fn new() -> Self {
        Thrift {
            out: Vec::new(),
            last: vec![0],
        }
    }

    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }

    fn zigzag(v: i64) -> u64 {
        ((v << 1) ^ (v >> 63)) as u64
    }

    fn field(&mut self, id: i16, ty: u8) {
        let last = self.last.last_mut().unwrap();
        let delta = id - *last;
        *last = id;
        if (1..=15).contains(&delta) {
            self.out.push(((delta as u8) << 4) | ty);
        } else {
            self.out.push(ty);
            self.varint(Self::zigzag(id.into()));
        }
    }

    fn i32(&mut self, id: i16, v: i32) -> &mut Self {
        self.field(id, T_I32);
        self.varint(Self::zigzag(v.into()));
        self
    }

    fn i64(&mut self, id: i16, v: i64) -> &mut Self {
        self.field(id, T_I64);
        self.varint(Self::zigzag(v));
        self
    }

    fn binary(&mut self, id: i16, b: &[u8]) -> &mut Self {
        self.field(id, T_BINARY);
        self.varint(b.len() as u64);
        self.out.extend_from_slice(b);
        self
    }

    fn begin_struct(&mut self, id: i16) -> &mut Self {
        self.field(id, T_STRUCT);
        self.last.push(0);
        self
    }

    fn end_struct(&mut self) -> &mut Self {
        self.out.push(0);
        self.last.pop();
        self
    }

    fn list(&mut self, id: i16, elem: u8, n: usize) -> &mut Self {
        self.field(id, T_LIST);
        self.list_head(elem, n)
    }

    /// A list header (after its field header, or none).
    fn list_head(&mut self, elem: u8, n: usize) -> &mut Self {
        if n < 15 {
            self.out.push(((n as u8) << 4) | elem);
        } else {
            self.out.push(0xf0 | elem);
            self.varint(n as u64);
        }
        self
    }

    /// A struct element of a list.
    fn begin_element(&mut self) -> &mut Self {
        self.last.push(0);
        self
    }

    fn list_i32(&mut self, v: i32) -> &mut Self {
        self.varint(Self::zigzag(v.into()));
        self
    }

    fn list_binary(&mut self, b: &[u8]) -> &mut Self {
        self.varint(b.len() as u64);
        self.out.extend_from_slice(b);
        self
    }

    fn finish(&mut self) -> Vec<u8> {
        self.out.push(0);
        std::mem::take(&mut self.out)
    }
}

const DATA_PAGE: i32 = 0;
const DICTIONARY_PAGE: i32 = 2;
const PLAIN: i32 = 0;
const RLE: i32 = 3;
const RLE_DICTIONARY: i32 = 8;
const UNCOMPRESSED: i32 = 0;
const ZSTD: i32 = 6;
const INT32: i32 = 1;
const REQUIRED: i32 = 0;

/// A v1 data page or dictionary page header.
fn page_header(
    kind: i32,
    uncompressed: i32,
    compressed: i32,
    num_values: i32,
    encoding: i32,
) -> Vec<u8> {
    let mut t = Thrift::new();
    t.i32(1, kind).i32(2, uncompressed).i32(3, compressed);
    if kind == DICTIONARY_PAGE {
        t.begin_struct(7)
            .i32(1, num_values)
            .i32(2, encoding)
            .end_struct();
    } else {
        t.begin_struct(5)
            .i32(1, num_values)
            .i32(2, encoding)
            .i32(3, RLE)
            .i32(4, RLE)
            .end_struct();
    }
    t.finish()
}

/// A page of `payload` (compressed with `codec`), its header declaring `declared`
/// uncompressed bytes (`None`: the payload's).
fn page(
    kind: i32,
    num_values: i32,
    payload: &[u8],
    codec: i32,
    declared: Option<i32>,
    encoding: i32,
) -> Vec<u8> {
    let data = if codec == ZSTD {
        zstd::bulk::compress(payload, 3).unwrap()
    } else {
        payload.to_vec()
    };
    let uncompressed = declared.unwrap_or(payload.len() as i32);
    let mut out = page_header(kind, uncompressed, data.len() as i32, num_values, encoding);
    out.extend_from_slice(&data);
    out
}

fn plain(values: impl IntoIterator<Item = i32>) -> Vec<u8> {
    values.into_iter().flat_map(i32::to_le_bytes).collect()
}

/// A plain data page of `values`, uncompressed.
fn plain_page(values: impl IntoIterator<Item = i32>) -> Vec<u8> {
    let payload = plain(values);
    page(
        DATA_PAGE,
        (payload.len() / 4) as i32,
        &payload,
        UNCOMPRESSED,
        None,
        PLAIN,
    )
}

/// An RLE_DICTIONARY data page of 10 values, indices 0, 1, 0, 1, ...
fn dictionary_indices_page() -> Vec<u8> {
    // Bit width 1; one bit-packed run of 2 groups of 8.
    let payload = [1, (2 << 1) | 1, 0xAA, 0xAA];
    page(DATA_PAGE, 10, &payload, UNCOMPRESSED, None, RLE_DICTIONARY)
}

/// A ZSTD data page of 10 values 0..10 followed by zeros, that really decompresses to
/// the `declared` bytes its header says: a frame of RLE blocks written by hand (nothing
/// of that size is allocated here).
fn zstd_bomb_page(declared: usize) -> Vec<u8> {
    let frame = zstd_bomb_frame(declared);
    let mut out = page_header(DATA_PAGE, declared as i32, frame.len() as i32, 10, PLAIN);
    out.extend_from_slice(&frame);
    out
}

/// A ZSTD frame of the 10 values 0..10 followed by zeros, `declared` bytes in all.
fn zstd_bomb_frame(declared: usize) -> Vec<u8> {
    const BLOCK: usize = 128 << 10;
    let head = plain(0..10);
    let mut frame = 0xFD2F_B528u32.to_le_bytes().to_vec();
    frame.push(0x00); // no content size, no checksum, no dictionary
    frame.push(7 << 3); // window 2^17 bytes
    let block = |out: &mut Vec<u8>, last: bool, kind: u32, size: usize| {
        let h = u32::from(last) | (kind << 1) | ((size as u32) << 3);
        out.extend_from_slice(&h.to_le_bytes()[..3]);
    };
    let mut zeros = declared - head.len();
    block(&mut frame, zeros == 0, 0, head.len());
    frame.extend_from_slice(&head);
    while zeros > 0 {
        let n = zeros.min(BLOCK);
        zeros -= n;
        block(&mut frame, zeros == 0, 1, n);
        frame.push(0);
    }
    frame
}

/// A row group whose every column chunk holds `pages`.
struct RowGroup {
    num_rows: i64,
    codec: i32,
    pages: Vec<u8>,
    /// The chunk starts with a dictionary page.
    dictionary: bool,
}

impl RowGroup {
    fn new(num_rows: i64, pages: Vec<u8>) -> Self {
        RowGroup {
            num_rows,
            codec: UNCOMPRESSED,
            pages,
            dictionary: false,
        }
    }
}

/// A schema element: a required group of `children` elements, or (`None`) a required
/// INT32 leaf.
type Element = (String, Option<i32>);

/// The `schema` elements (the root first), as the elements of a list.
fn schema_elements(t: &mut Thrift, schema: &[Element]) {
    for (i, (name, children)) in schema.iter().enumerate() {
        t.begin_element();
        match children {
            Some(n) if i == 0 => t.binary(4, name.as_bytes()).i32(5, *n),
            Some(n) => t.i32(3, REQUIRED).binary(4, name.as_bytes()).i32(5, *n),
            None => t.i32(1, INT32).i32(3, REQUIRED).binary(4, name.as_bytes()),
        };
        t.end_struct();
    }
}

/// The schema elements of one INT32 leaf `depth` required groups below the root.
fn nested_schema(depth: usize) -> Vec<Element> {
    let mut schema = vec![("schema".to_string(), Some(1))];
    schema.extend((0..depth).map(|i| (format!("g{i}"), Some(1))));
    schema.push(("x".to_string(), None));
    schema
}

/// A file of no row groups whose footer is `footer` (a `PAR1` before it if
/// `leading_magic`).
fn file_of_footer(footer: &[u8], leading_magic: bool) -> Vec<u8> {
    let mut file = if leading_magic {
        b"PAR1".to_vec()
    } else {
        Vec::new()
    };
    file.extend_from_slice(footer);
    file.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    file.extend_from_slice(b"PAR1");
    file
}

/// A Parquet file of the `schema` elements (the root first) whose leaves are
/// `leaf_paths`, and the row groups given, every leaf's chunk holding the row group's
/// pages; the footer written by hand.
fn parquet_file_of(schema: &[Element], leaf_paths: &[Vec<String>], groups: &[RowGroup]) -> Vec<u8> {
    parquet_file_declaring(schema, leaf_paths, groups, None)
}

/// [`parquet_file_of`], its FileMetaData declaring `num_rows` rows (`None`: the sum of
/// its row groups').
fn parquet_file_declaring(
    schema: &[Element],
    leaf_paths: &[Vec<String>],
    groups: &[RowGroup],
    num_rows: Option<i64>,
) -> Vec<u8> {
    let mut file = b"PAR1".to_vec();
    let mut offsets = Vec::new();
    for g in groups {
        let mut per_leaf = Vec::new();
        for _ in leaf_paths {
            per_leaf.push(file.len() as i64);
            file.extend_from_slice(&g.pages);
        }
        offsets.push(per_leaf);
    }
    let mut t = Thrift::new();
    t.i32(1, 1); // version
    t.list(2, T_STRUCT, schema.len());
    schema_elements(&mut t, schema);
    let total = groups.iter().map(|g| g.num_rows).fold(0, i64::wrapping_add);
    t.i64(3, num_rows.unwrap_or(total));
    t.list(4, T_STRUCT, groups.len());
    for (g, per_leaf) in groups.iter().zip(&offsets) {
        t.begin_element();
        t.list(1, T_STRUCT, leaf_paths.len());
        for (path, &offset) in leaf_paths.iter().zip(per_leaf) {
            t.begin_element();
            t.i64(2, offset);
            t.begin_struct(3); // ColumnMetaData
            t.i32(1, INT32);
            t.list(2, T_I32, 2).list_i32(PLAIN).list_i32(RLE);
            t.list(3, T_BINARY, path.len());
            for part in path {
                t.list_binary(part.as_bytes());
            }
            t.i32(4, g.codec);
            t.i64(5, g.num_rows);
            t.i64(6, g.pages.len() as i64);
            t.i64(7, g.pages.len() as i64);
            t.i64(9, offset);
            if g.dictionary {
                t.i64(11, offset);
            }
            t.end_struct();
            t.end_struct();
        }
        t.i64(2, (g.pages.len() * leaf_paths.len()) as i64);
        t.i64(3, g.num_rows);
        t.end_struct();
    }
    let footer = t.finish();
    file.extend_from_slice(&footer);
    file.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    file.extend_from_slice(b"PAR1");
    file
}

/// A file of `columns` required INT32 columns x0, x1, ...
fn parquet_file(columns: usize, groups: &[RowGroup]) -> Vec<u8> {
    let mut schema = vec![("schema".to_string(), Some(columns as i32))];
    let names: Vec<String> = (0..columns).map(|c| format!("x{c}")).collect();
    schema.extend(names.iter().map(|n| (n.clone(), None)));
    let paths: Vec<Vec<String>> = names.into_iter().map(|n| vec![n]).collect();
    parquet_file_of(&schema, &paths, groups)
}

/// A file whose one INT32 leaf lies `depth` required groups below the root.
fn nested_file(depth: usize, groups: &[RowGroup]) -> Vec<u8> {
    let schema = nested_schema(depth);
    let mut path: Vec<String> = (0..depth).map(|i| format!("g{i}")).collect();
    path.push("x".to_string());
    parquet_file_of(&schema, &[path], groups)
}

/// What reading `bytes` gives: the first column of each batch (its INT32 values), or
/// the first error; `limit`: the decompression limit to set.
fn read(ctx: &Context, bytes: &[u8], limit: Option<usize>) -> Result<Vec<Vec<i32>>, Error> {
    let file = TempFile::with_bytes("hostile.parquet", bytes);
    let mut reader = DeviceParquetReader::open(file.path(), ctx, None)?;
    if let Some(limit) = limit {
        reader.set_decompression_limit(limit);
    }
    let mut out = Vec::new();
    for batch in reader {
        let host = batch?.to_host()?;
        let column = host.column(0).as_any().downcast_ref::<Int32Array>();
        out.push(column.expect("an INT32 column").values().to_vec());
    }
    Ok(out)
}

fn invalid_data(result: Result<Vec<Vec<i32>>, Error>, label: &str) -> String {
    match result {
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidData, "{label}: {e}");
            e.to_string()
        }
        Ok(batches) => panic!("{label}: read {batches:?} with no error"),
    }
}

pub(crate) fn parquet_row_groups_give_exactly_the_rows_their_footer_declares(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let before = ctx.bytes_allocated();
    // The truth: one batch of the 10 rows.
    let good = parquet_file(1, &[RowGroup::new(10, plain_page(0..10))]);
    assert_eq!(
        read(&ctx, &good, None).unwrap(),
        vec![(0..10).collect::<Vec<_>>()]
    );
    for (declared, label) in [
        (1000, "the footer declares 1000 rows, the pages hold 10"),
        (1 << 40, "the footer declares 2^40 rows, the pages hold 10"),
        (3, "the footer declares 3 rows, the pages hold 10"),
    ] {
        let file = parquet_file(1, &[RowGroup::new(declared, plain_page(0..10))]);
        let message = invalid_data(read(&ctx, &file, None), label);
        assert!(message.contains("row group 0"), "{label}: {message}");
        assert!(message.contains("footer"), "{label}: {message}");
    }
    // A footer declaring 1 row over a page of 10 000 values: refused at the second row,
    // not 10 000 batches of one row.
    let file = TempFile::with_bytes(
        "one-row.parquet",
        &parquet_file(1, &[RowGroup::new(1, plain_page(0..10_000))]),
    );
    let results: Vec<_> = DeviceParquetReader::open(file.path(), &ctx, None)
        .unwrap()
        .collect();
    assert!(results.len() <= 2, "{} batches", results.len());
    let err = results.last().unwrap().as_ref().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    drop(results);
    // A later row group that lies ends the file there, after the good ones.
    let file = parquet_file(
        1,
        &[
            RowGroup::new(10, plain_page(0..10)),
            RowGroup::new(11, plain_page(0..10)),
        ],
    );
    let handle = TempFile::with_bytes("second-lies.parquet", &file);
    for threads in [1, 2] {
        ctx.set_file_options(FileOptions::default().with_threads(threads).unwrap());
        let results: Vec<_> = DeviceParquetReader::open(handle.path(), &ctx, None)
            .unwrap()
            .collect();
        assert_eq!(results.len(), 2, "{threads} threads");
        assert_eq!(results[0].as_ref().unwrap().num_rows(), 10);
        assert_eq!(
            results[1].as_ref().unwrap_err().kind(),
            ErrorKind::InvalidData
        );
    }
    ctx.set_file_options(FileOptions::default());
    assert_eq!(ctx.bytes_allocated(), before);
    Ok(())
}

pub(crate) fn parquet_row_counts_summing_past_usize_are_invalid_data(f: &Fixture) -> CaseResult {
    let ctx = context(f);
    let groups: Vec<RowGroup> = (0..3)
        .map(|_| RowGroup::new(i64::MAX, plain_page(0..10)))
        .collect();
    let file = TempFile::with_bytes("overflow.parquet", &parquet_file(1, &groups));
    let err = DeviceParquetReader::open(file.path(), &ctx, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("row counts"), "{err}");
    Ok(())
}

/// Open `bytes` on a thread with the stack of a main thread (8 MiB): a stack overflow
/// would abort the process.
fn open_on_a_thread(bytes: &[u8], ctx: &Context) -> Result<DeviceParquetReader, Error> {
    let file = TempFile::with_bytes("deep.parquet", bytes);
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || DeviceParquetReader::open(file.path(), &ctx, None))
        .unwrap()
        .join()
        .unwrap()
}

pub(crate) fn parquet_schemas_nested_too_deep_or_with_absent_children_are_invalid_data(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    // 128 groups deep (the limit): reads, the value at the bottom.
    let file = TempFile::with_bytes(
        "deep-128.parquet",
        &nested_file(128, &[RowGroup::new(2, plain_page([7, 8]))]),
    );
    // Read on this thread (a test thread's 2 MiB stack; the decoding threads' too).
    let batches = cudabuf_arrow::read_parquet(file.path(), &ctx, None).unwrap();
    assert_eq!(batches.len(), 1);
    // arrow-rs builds a host batch recursively (`make_array`), more than 2 MiB of stack
    // for 128 nested structs in a debug build: on a thread of 8 MiB.
    let batch = batches.into_iter().next().unwrap();
    let host = std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || batch.to_host().unwrap())
        .unwrap()
        .join()
        .unwrap();
    let mut column = host.column(0).clone();
    for _ in 0..128 {
        column = column
            .as_any()
            .downcast_ref::<StructArray>()
            .unwrap()
            .column(0)
            .clone();
    }
    assert_eq!(
        column
            .as_any()
            .downcast_ref::<Int32Array>()
            .unwrap()
            .values(),
        &[7, 8]
    );
    // One deeper, and 100 000 deep (an 800 KB file that overflowed the stack).
    for depth in [129, 100_000] {
        let err = open_on_a_thread(&nested_file(depth, &[]), &ctx).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "depth {depth}: {err}");
        assert!(err.to_string().contains("128 levels"), "{err}");
    }
    // The same footer with no PAR1 before it (the crate needs none), starting at byte 0.
    let mut t = Thrift::new();
    t.i32(1, 1).list(2, T_STRUCT, 129 + 2);
    schema_elements(&mut t, &nested_schema(129));
    t.i64(3, 0).list(4, T_STRUCT, 0);
    let err = open_on_a_thread(&file_of_footer(&t.finish(), false), &ctx).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidData,
        "a footer at byte 0: {err}"
    );
    assert!(
        err.to_string().contains("128 levels"),
        "a footer at byte 0: {err}"
    );
    // A root claiming i32::MAX children (the crate reserved room for them all) or a
    // negative count.
    for children in [i32::MAX, 2, -1] {
        let schema = [
            ("schema".to_string(), Some(children)),
            ("x".to_string(), None),
        ];
        let file = parquet_file_of(&schema, &[vec!["x".to_string()]], &[]);
        let err = open_on_a_thread(&file, &ctx).unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidData,
            "{children} children: {err}"
        );
        assert!(
            err.to_string().contains("children"),
            "{children} children: {err}"
        );
    }
    Ok(())
}

pub(crate) fn parquet_pages_beyond_the_decompression_limit_are_invalid_data(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    assert_eq!(DEFAULT_PARQUET_DECOMPRESSION_LIMIT, 1 << 30);
    let zstd_group = |pages: Vec<u8>| RowGroup {
        codec: ZSTD,
        ..RowGroup::new(10, pages)
    };
    // A page of 40 bytes whose header declares i32::MAX (the crate reserved that much).
    let file = parquet_file(
        1,
        &[zstd_group(page(
            DATA_PAGE,
            10,
            &plain(0..10),
            ZSTD,
            Some(i32::MAX),
            PLAIN,
        ))],
    );
    let message = invalid_data(read(&ctx, &file, None), "a page declaring 2 GiB");
    assert!(message.contains("2147483647 bytes"), "{message}");
    assert!(message.contains("set_decompression_limit"), "{message}");
    // 3 columns of pages that really decompress to 512 MiB each: over the default limit
    // together, refused before any is decompressed.
    let bombs = parquet_file(3, &[zstd_group(zstd_bomb_page(512 << 20))]);
    let message = invalid_data(read(&ctx, &bombs, None), "3 pages of 512 MiB");
    assert!(
        message.contains(&format!("{} bytes", 1u64 << 30)),
        "{message}"
    );
    // Pages that really decompress to 4 MiB, 2 columns of them: refused under a limit of
    // 6 MiB, read under 8 MiB (the 10 values the page declares; zeros after them).
    let small = parquet_file(2, &[zstd_group(zstd_bomb_page(4 << 20))]);
    let message = invalid_data(read(&ctx, &small, Some(6 << 20)), "2 pages of 4 MiB");
    assert!(message.contains("6291456 bytes"), "{message}");
    assert_eq!(
        read(&ctx, &small, Some(8 << 20)).unwrap(),
        vec![(0..10).collect::<Vec<_>>()]
    );
    // Row groups that fit one at a time but not all at once read with every thread
    // count: the threads wait for room rather than fail.
    let exact = |n| {
        let mut head = page_header(DATA_PAGE, 40, 40, 10, PLAIN);
        head.extend(plain((0..10).map(|v| v + n)));
        RowGroup::new(10, head)
    };
    let groups: Vec<RowGroup> = (0..6).map(exact).collect();
    let file = parquet_file(2, &groups);
    for threads in [1, 2, 4] {
        ctx.set_file_options(FileOptions::default().with_threads(threads).unwrap());
        let batches = read(&ctx, &file, Some(100)).unwrap();
        let expected: Vec<Vec<i32>> = (0..6).map(|n| (n..n + 10).collect()).collect();
        assert_eq!(batches, expected, "{threads} threads");
    }
    ctx.set_file_options(FileOptions::default());
    Ok(())
}

pub(crate) fn parquet_page_headers_that_lie_about_their_contents_are_invalid_data(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let dictionary = |values: i32| {
        let mut p = page(
            DICTIONARY_PAGE,
            values,
            &plain([100, 200]),
            UNCOMPRESSED,
            None,
            PLAIN,
        );
        p.extend(dictionary_indices_page());
        RowGroup {
            dictionary: true,
            ..RowGroup::new(10, p)
        }
    };
    // The truth: a dictionary of 2 values.
    let good = parquet_file(1, &[dictionary(2)]);
    assert_eq!(
        read(&ctx, &good, None).unwrap(),
        vec![[100, 200].repeat(5)],
        "a dictionary-encoded chunk"
    );
    // A dictionary page of 8 bytes declaring 2^24 values (the crate filled
    // num_values x 4 bytes of host memory for it: 4 GiB for 2^30).
    let file = parquet_file(1, &[dictionary(1 << 24)]);
    let message = invalid_data(
        read(&ctx, &file, None),
        "a dictionary of 2^24 values in 8 bytes",
    );
    assert!(message.contains("16777216 values"), "{message}");
    // An uncompressed page declaring another uncompressed size than it holds.
    let mut lying = page_header(DATA_PAGE, 400, 40, 10, PLAIN);
    lying.extend(plain(0..10));
    let file = parquet_file(1, &[RowGroup::new(10, lying)]);
    let message = invalid_data(read(&ctx, &file, None), "uncompressed 400 of 40 bytes");
    assert!(message.contains("400 bytes"), "{message}");
    // Negative sizes, a page past its chunk, a header cut short.
    let raw = |unc: i32, comp: i32, cut: usize| {
        let mut p = page_header(DATA_PAGE, unc, comp, 10, PLAIN);
        p.extend(plain(0..10));
        p.truncate(p.len() - cut);
        RowGroup::new(10, p)
    };
    for (group, label) in [
        (raw(40, -5, 0), "compressed size -5"),
        (raw(-1, 40, 0), "uncompressed size -1"),
        (raw(4000, 4000, 0), "a page past its chunk"),
        (
            RowGroup::new(10, page_header(DATA_PAGE, 40, 40, 10, PLAIN)[..6].to_vec()),
            "a header cut short",
        ),
    ] {
        invalid_data(read(&ctx, &parquet_file(1, &[group]), None), label);
    }
    // The truth again: a chunk of 5000 pages of one value each (about 120 KB of page
    // headers and values, read through windows of 64 KiB, headers crossing their ends).
    let pages: Vec<u8> = (0..5000).flat_map(|v| plain_page([v])).collect();
    let file = parquet_file(1, &[RowGroup::new(5000, pages)]);
    assert_eq!(
        read(&ctx, &file, None).unwrap(),
        vec![(0..5000).collect::<Vec<_>>()],
        "5000 one-value pages"
    );
    Ok(())
}

/// A page header of `fields` (written on `t`) followed by field 4 (crc, an i32 to the
/// `parquet` crate) declared a binary holding `hidden`: bytes a reader that skips by the
/// declared type never sees, and the crate reads as more fields of the header.
fn header_hiding(t: &mut Thrift, hidden: impl FnOnce(&mut Thrift)) -> Vec<u8> {
    let mut region = Thrift::new();
    region.last = vec![4];
    hidden(&mut region);
    let region = region.out;
    t.field(4, T_BINARY);
    t.varint(region.len() as u64);
    t.out.extend_from_slice(&region);
    t.finish()
}

pub(crate) fn parquet_fields_of_another_thrift_type_than_the_crate_reads_are_invalid_data(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    // The schema (FileMetaData field 2) declared an i32: one varint to skip, a list of
    // 100 000 nested groups to the crate (a stack overflow).
    let mut t = Thrift::new();
    t.i32(1, 1);
    t.field(2, T_I32);
    t.list_head(T_STRUCT, 100_000 + 2);
    schema_elements(&mut t, &nested_schema(100_000));
    t.i64(3, 0).list(4, T_STRUCT, 0);
    let err = open_on_a_thread(&file_of_footer(&t.finish(), true), &ctx).unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::InvalidData,
        "a schema declared i32: {err}"
    );
    assert!(err.to_string().contains("Thrift type"), "{err}");
    // A dictionary page header of 2 values whose crc hides a second
    // dictionary_page_header of 2^26 values (the crate filled 256 MiB for them).
    let mut t = Thrift::new();
    t.i32(1, DICTIONARY_PAGE).i32(2, 8).i32(3, 8);
    t.begin_struct(7).i32(1, 2).i32(2, PLAIN).end_struct();
    let mut pages = header_hiding(&mut t, |r| {
        r.begin_struct(7).i32(1, 1 << 26).i32(2, PLAIN).end_struct();
    });
    pages.extend(plain([100, 200]));
    pages.extend(dictionary_indices_page());
    let group = RowGroup {
        dictionary: true,
        ..RowGroup::new(10, pages)
    };
    let message = invalid_data(
        read(&ctx, &parquet_file(1, &[group]), None),
        "a hidden dictionary of 2^26 values",
    );
    assert!(message.contains("Thrift type"), "{message}");
    // A ZSTD page of 64 MiB decompressed whose header declares 40 bytes, its crc hiding
    // the true size: read past a limit of 1 MiB.
    let frame = zstd_bomb_frame(64 << 20);
    let mut t = Thrift::new();
    t.i32(1, DATA_PAGE).i32(2, 40).i32(3, frame.len() as i32);
    t.begin_struct(5)
        .i32(1, 10)
        .i32(2, PLAIN)
        .i32(3, RLE)
        .i32(4, RLE)
        .end_struct();
    let mut pages = header_hiding(&mut t, |r| {
        r.i32(2, 64 << 20);
    });
    pages.extend(frame);
    let group = RowGroup {
        codec: ZSTD,
        ..RowGroup::new(10, pages)
    };
    let message = invalid_data(
        read(&ctx, &parquet_file(1, &[group]), Some(1 << 20)),
        "a hidden uncompressed size of 64 MiB",
    );
    assert!(message.contains("Thrift type"), "{message}");
    Ok(())
}

/// `depth` nested lists of INT32 (each a LIST group and its repeated group: 2 levels):
/// the batch and the Parquet file arrow-rs writes of it (on a thread of 8 MiB: its
/// writer recurses deeper than a test thread's 2 MiB allow in a debug build).
fn nested_lists(depth: usize) -> (arrow::record_batch::RecordBatch, Vec<u8>) {
    std::thread::Builder::new()
        .stack_size(8 << 20)
        .spawn(move || write_nested_lists(depth))
        .unwrap()
        .join()
        .unwrap()
}

fn write_nested_lists(depth: usize) -> (arrow::record_batch::RecordBatch, Vec<u8>) {
    use arrow::array::{ArrayRef, ListArray};
    use arrow::datatypes::{DataType, Field};
    use std::sync::Arc;
    let mut array: ArrayRef = Arc::new(Int32Array::from(vec![7, 8]));
    for _ in 0..depth {
        let field = Arc::new(Field::new("item", array.data_type().clone(), true));
        let offsets = arrow::buffer::OffsetBuffer::from_lengths([array.len()]);
        array = Arc::new(ListArray::new(field, offsets, array, None));
    }
    let batch = arrow::record_batch::RecordBatch::try_from_iter([("deep", array)]).unwrap();
    assert!(matches!(batch.column(0).data_type(), DataType::List(_)));
    let mut bytes = Vec::new();
    // Without the Arrow schema in the footer: arrow-rs cannot read the flatbuffer of one
    // that nests this deep (DepthLimitReached), whatever reads the Parquet schema.
    let options =
        parquet::arrow::arrow_writer::ArrowWriterOptions::new().with_skip_arrow_metadata(true);
    let mut writer =
        parquet::arrow::ArrowWriter::try_new_with_options(&mut bytes, batch.schema(), options)
            .unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    (batch, bytes)
}

pub(crate) fn parquet_files_of_64_nested_lists_read_and_65_are_invalid_data(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    // 64 nested lists: 128 levels of groups, the limit. Opened and read on threads of
    // the default 2 MiB stack (the decoding threads' too).
    let (batch, bytes) = nested_lists(64);
    let file = TempFile::with_bytes("lists-64.parquet", &bytes);
    let read_ctx = ctx.clone();
    let path = file.path().to_path_buf();
    let batches = std::thread::spawn(move || cudabuf_arrow::read_parquet(&path, &read_ctx, None))
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].to_host().unwrap(), batch);
    drop(batches);
    // 65: 130 levels.
    let (_, bytes) = nested_lists(65);
    let err = open_on_a_thread(&bytes, &ctx).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidData, "65 nested lists: {err}");
    assert!(err.to_string().contains("128 levels"), "{err}");
    Ok(())
}

/// An unknown field (id 100) that is a list of `i32::MAX` booleans, and one that is a
/// map<bool, bool> of `i32::MAX` entries: 9 bytes each, that the `parquet` crate's skip
/// loops over for seconds.
const BOOL_LIST_FIELD: [u8; 9] = [0x09, 0xc8, 0x01, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07];
const BOOL_MAP_FIELD: [u8; 9] = [0x0b, 0xc8, 0x01, 0xff, 0xff, 0xff, 0xff, 0x07, 0x11];

pub(crate) fn parquet_skipped_boolean_collections_are_invalid_data_at_once(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    for (field, what) in [(BOOL_LIST_FIELD, "list"), (BOOL_MAP_FIELD, "map")] {
        // In the footer: before its stop byte.
        let good = parquet_file(1, &[RowGroup::new(10, plain_page(0..10))]);
        let len = good.len();
        let footer_len = u32::from_le_bytes(good[len - 8..len - 4].try_into().unwrap()) as usize;
        assert_eq!(good[len - 9], 0);
        let mut file = good[..len - 9].to_vec();
        file.extend_from_slice(&field);
        file.push(0);
        file.extend_from_slice(&((footer_len + field.len()) as u32).to_le_bytes());
        file.extend_from_slice(b"PAR1");
        let start = std::time::Instant::now();
        let message = invalid_data(read(&ctx, &file, None), &format!("a footer's {what}"));
        assert!(message.contains("booleans"), "{message}");
        assert!(start.elapsed().as_secs() < 2, "{:?}", start.elapsed());
        // In a page header: after its fields.
        let payload = plain(0..10);
        let mut t = Thrift::new();
        t.i32(1, DATA_PAGE)
            .i32(2, payload.len() as i32)
            .i32(3, payload.len() as i32);
        t.begin_struct(5)
            .i32(1, 10)
            .i32(2, PLAIN)
            .i32(3, RLE)
            .i32(4, RLE)
            .end_struct();
        t.out.extend_from_slice(&field);
        let mut pages = t.finish();
        pages.extend_from_slice(&payload);
        let start = std::time::Instant::now();
        let message = invalid_data(
            read(&ctx, &parquet_file(1, &[RowGroup::new(10, pages)]), None),
            &format!("a page header's {what}"),
        );
        assert!(message.contains("booleans"), "{message}");
        assert!(start.elapsed().as_secs() < 2, "{:?}", start.elapsed());
    }
    Ok(())
}

pub(crate) fn parquet_files_declaring_other_rows_than_their_row_groups_are_invalid_data(
    f: &Fixture,
) -> CaseResult {
    let ctx = context(f);
    let schema = [("schema".to_string(), Some(1)), ("x0".to_string(), None)];
    let paths = [vec!["x0".to_string()]];
    let groups = [RowGroup::new(1000, plain_page(0..1000))];
    assert_eq!(
        read(
            &ctx,
            &parquet_file_declaring(&schema, &paths, &groups, Some(1000)),
            None
        )
        .unwrap(),
        vec![(0..1000).collect::<Vec<_>>()]
    );
    // The crate lowers its batch size to the file's num_rows: 10 or 0 here.
    for declared in [10, 0, 2000] {
        let file = TempFile::with_bytes(
            "num-rows.parquet",
            &parquet_file_declaring(&schema, &paths, &groups, Some(declared)),
        );
        let err = DeviceParquetReader::open(file.path(), &ctx, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidData, "{declared}: {err}");
        let message = err.to_string();
        assert!(
            message.contains(&format!("{declared} rows")) && message.contains("1000"),
            "{message}"
        );
    }
    Ok(())
}
