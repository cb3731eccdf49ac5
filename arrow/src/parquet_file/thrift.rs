//! Just enough of the Thrift compact protocol to check a Parquet file before the
//! `parquet` crate decodes it: the footer ([`check_schema`]) and the page headers of a
//! column chunk ([`read_page_header`]).
//!
//! The checks must read the bytes the crate reads. The crate reads a field it knows by
//! id as its IDL type, whatever type the bytes declare, and skips every other field by
//! the type declared; so these readers know the same fields ([`Desc`], mirroring
//! `parquet` 60.1's readers) and refuse one declared of another type than its IDL type
//! (where the two readers would part ways), and skip the others exactly as the crate
//! does (booleans in a list take no byte; a field header of type 0 ends a struct).
//!
//! Everything here is bounded by its input: every value read or looped over takes at
//! least one byte (a list of booleans being skipped is not looped over, and a read
//! refuses to skip more booleans in lists, sets and maps than its input has bytes, as
//! the crate loops over each), nothing is
//! allocated from a count the input declares, and skipping nested values recurses at
//! most [`MAX_SKIP_DEPTH`] levels.

use std::fmt;

/// The most nested structs, lists and maps skipped inside one another (the `parquet`
/// crate's own reader stops at the same depth).
const MAX_SKIP_DEPTH: usize = 64;

/// The most levels of groups a Parquet schema may nest below its root: 128. Every group
/// element below the root is a level, so each Parquet LIST or MAP takes two (its
/// annotated group and the repeated group inside it) and each struct one: 64 nested
/// lists, the nesting Arrow IPC readers accept (arrow-rs's flatbuffer depth, Arrow C++'s
/// `kMaxNestingDepth`), fit. Far beyond real schemas, and shallow enough that the
/// recursive schema conversions and column readers of the `parquet` crate and arrow-rs
/// fit the 2 MiB stack of a spawned thread (tested in a debug build).
pub(crate) const MAX_SCHEMA_DEPTH: usize = 128;

/// Why bytes are not what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ThriftError {
    /// The bytes end before the value does (more may be read).
    Truncated,
    /// The bytes are not valid.
    Invalid(String),
}

impl fmt::Display for ThriftError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ThriftError::Truncated => f.write_str("the Thrift value ends past its bytes"),
            ThriftError::Invalid(reason) => f.write_str(reason),
        }
    }
}

type ThriftResult<T> = std::result::Result<T, ThriftError>;

fn invalid<T>(reason: impl Into<String>) -> ThriftResult<T> {
    Err(ThriftError::Invalid(reason.into()))
}

// Compact protocol types.
const BOOL_TRUE: u8 = 1;
const BOOL_FALSE: u8 = 2;
const BYTE: u8 = 3;
const I16: u8 = 4;
const I32: u8 = 5;
const I64: u8 = 6;
const DOUBLE: u8 = 7;
const BINARY: u8 = 8;
const LIST: u8 = 9;
const SET: u8 = 10;
const MAP: u8 = 11;
const STRUCT: u8 = 12;
const UUID: u8 = 13;

/// A reader of compact-protocol values over `buf`.
pub(super) struct Compact<'a> {
    buf: &'a [u8],
    pos: usize,
    /// The boolean elements of lists, sets and maps still to be skipped
    /// ([`Compact::skip_bools`]): as many as `buf` has bytes.
    bools: u64,
}

impl<'a> Compact<'a> {
    pub(super) fn new(buf: &'a [u8]) -> Self {
        Compact {
            buf,
            pos: 0,
            bools: buf.len() as u64,
        }
    }

    /// Skip `n` boolean elements of a list, set or map. They take no byte, but the
    /// `parquet` crate's skip loops over each one: a 9-byte list of `i32::MAX` booleans
    /// costs it seconds. So a read may skip at most as many as its input has bytes,
    /// keeping the crate's work proportional to the bytes checked.
    fn skip_bools(&mut self, n: u64) -> ThriftResult<()> {
        match self.bools.checked_sub(n) {
            Some(left) => {
                self.bools = left;
                Ok(())
            }
            None => invalid(format!(
                "lists or maps of booleans with more elements than the {} bytes read",
                self.buf.len()
            )),
        }
    }

    /// The bytes read so far.
    pub(super) fn position(&self) -> usize {
        self.pos
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn byte(&mut self) -> ThriftResult<u8> {
        let b = *self.buf.get(self.pos).ok_or(ThriftError::Truncated)?;
        self.pos += 1;
        Ok(b)
    }

    fn advance(&mut self, n: u64) -> ThriftResult<()> {
        match usize::try_from(n) {
            Ok(n) if n <= self.remaining() => {
                self.pos += n;
                Ok(())
            }
            _ => Err(ThriftError::Truncated),
        }
    }

    fn varint(&mut self) -> ThriftResult<u64> {
        let mut value = 0u64;
        for shift in (0..70).step_by(7) {
            let b = self.byte()?;
            if shift == 63 && b > 1 {
                return invalid("a varint overflows 64 bits");
            }
            value |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        invalid("a varint of more than 10 bytes")
    }

    fn i64(&mut self) -> ThriftResult<i64> {
        let z = self.varint()?;
        Ok((z >> 1) as i64 ^ -((z & 1) as i64))
    }

    fn i32(&mut self) -> ThriftResult<i32> {
        i32::try_from(self.i64()?).or_else(|_| invalid("an i32 out of range"))
    }

    /// The next field header of a struct whose last field id was `last`: `None` at its
    /// end (STOP).
    fn field(&mut self, last: &mut i16) -> ThriftResult<Option<(i16, u8)>> {
        let b = self.byte()?;
        let ty = b & 0x0f;
        if ty == 0 {
            // The `parquet` crate ends a struct at any type 0, whatever its high bits.
            return Ok(None);
        }
        let delta = i16::from(b >> 4);
        let id = if delta == 0 {
            i16::try_from(self.i64()?).or_else(|_| invalid("a field id out of range"))?
        } else {
            last.checked_add(delta)
                .map_or_else(|| invalid("a field id out of range"), Ok)?
        };
        *last = id;
        Ok(Some((id, ty)))
    }

    /// A list or set header: the element type and count. A count of elements that take
    /// a byte or more each is checked against the bytes left ([`ThriftError::Truncated`]
    /// past them); booleans take none when skipped.
    fn list_header(&mut self) -> ThriftResult<(u8, u64)> {
        let b = self.byte()?;
        let ty = b & 0x0f;
        let n = match b >> 4 {
            15 => self.varint()?,
            n => u64::from(n),
        };
        if n > i32::MAX as u64 {
            return invalid(format!("a list of {n} elements"));
        }
        if !is_bool(ty) && n > self.remaining() as u64 {
            return Err(ThriftError::Truncated);
        }
        Ok((ty, n))
    }

    /// Skip a value of type `ty`, `depth` levels inside others.
    fn skip(&mut self, ty: u8, depth: usize) -> ThriftResult<()> {
        if depth > MAX_SKIP_DEPTH {
            return invalid(format!(
                "Thrift values nest more than {MAX_SKIP_DEPTH} deep"
            ));
        }
        match ty {
            BOOL_TRUE | BOOL_FALSE => Ok(()),
            BYTE => self.byte().map(|_| ()),
            I16 | I32 | I64 => self.varint().map(|_| ()),
            DOUBLE => self.advance(8),
            UUID => self.advance(16),
            BINARY => {
                let n = self.varint()?;
                self.advance(n)
            }
            LIST | SET => {
                // Booleans take no byte: the `parquet` crate skips them so.
                let (elem, n) = self.list_header()?;
                if is_bool(elem) {
                    self.skip_bools(n)?;
                } else {
                    for _ in 0..n {
                        self.skip(elem, depth + 1)?;
                    }
                }
                Ok(())
            }
            MAP => {
                let n = self.varint()?;
                if n > i32::MAX as u64 {
                    return invalid(format!("a map of {n} entries"));
                }
                if n == 0 {
                    return Ok(());
                }
                let types = self.byte()?;
                let (key, value) = (types >> 4, types & 0x0f);
                if is_bool(key) && is_bool(value) {
                    return self.skip_bools(n);
                }
                if n > self.remaining() as u64 {
                    return Err(ThriftError::Truncated);
                }
                for _ in 0..n {
                    for t in [key, value] {
                        if !is_bool(t) {
                            self.skip(t, depth + 1)?;
                        }
                    }
                }
                Ok(())
            }
            STRUCT => {
                let mut last = 0;
                while let Some((_, t)) = self.field(&mut last)? {
                    self.skip(t, depth + 1)?;
                }
                Ok(())
            }
            _ => invalid(format!("unknown Thrift type {ty}")),
        }
    }
}

fn is_bool(ty: u8) -> bool {
    matches!(ty, BOOL_TRUE | BOOL_FALSE)
}

/// The type the Parquet Thrift IDL gives a field (or a list's elements).
#[derive(Clone, Copy)]
enum Ty {
    Bool,
    I8,
    I16,
    /// Also every enum.
    I32,
    I64,
    Double,
    /// Also strings.
    Binary,
    List(&'static Ty),
    Struct(&'static Desc),
}

impl Ty {
    /// Whether a value of compact type `wire` is of this type.
    fn matches(self, wire: u8) -> bool {
        match self {
            Ty::Bool => is_bool(wire),
            Ty::I8 => wire == BYTE,
            Ty::I16 => wire == I16,
            Ty::I32 => wire == I32,
            Ty::I64 => wire == I64,
            Ty::Double => wire == DOUBLE,
            Ty::Binary => wire == BINARY,
            Ty::List(_) => wire == LIST,
            Ty::Struct(_) => wire == STRUCT,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::I8 => "i8",
            Ty::I16 => "i16",
            Ty::I32 => "i32",
            Ty::I64 => "i64",
            Ty::Double => "double",
            Ty::Binary => "binary",
            Ty::List(_) => "list",
            Ty::Struct(_) => "struct",
        }
    }
}

/// A Thrift struct (or union) as the `parquet` crate reads it: the fields it reads by id,
/// each with its IDL type. The crate reads such a field as its IDL type whatever type
/// the bytes declare, and skips every other field by the type the bytes declare; so a
/// field it reads must declare its IDL type here, or the two readers would part ways.
struct Desc {
    name: &'static str,
    fields: &'static [(i16, Ty)],
}

const EMPTY: Desc = Desc {
    name: "an empty struct",
    fields: &[],
};
const KEY_VALUE: Desc = Desc {
    name: "KeyValue",
    fields: &[(1, Ty::Binary), (2, Ty::Binary)],
};
const DECIMAL_TYPE: Desc = Desc {
    name: "DecimalType",
    fields: &[(1, Ty::I32), (2, Ty::I32)],
};
const TIME_UNIT: Desc = Desc {
    name: "TimeUnit",
    fields: &[
        (1, Ty::Struct(&EMPTY)),
        (2, Ty::Struct(&EMPTY)),
        (3, Ty::Struct(&EMPTY)),
    ],
};
const TIMESTAMP_TYPE: Desc = Desc {
    name: "TimestampType",
    fields: &[(1, Ty::Bool), (2, Ty::Struct(&TIME_UNIT))],
};
const INT_TYPE: Desc = Desc {
    name: "IntType",
    fields: &[(1, Ty::I8), (2, Ty::Bool)],
};
const VARIANT_TYPE: Desc = Desc {
    name: "VariantType",
    fields: &[(1, Ty::I8)],
};
const GEOMETRY_TYPE: Desc = Desc {
    name: "GeometryType",
    fields: &[(1, Ty::Binary)],
};
const GEOGRAPHY_TYPE: Desc = Desc {
    name: "GeographyType",
    fields: &[(1, Ty::Binary), (2, Ty::I32)],
};
const LOGICAL_TYPE: Desc = Desc {
    name: "LogicalType",
    fields: &[
        (1, Ty::Struct(&EMPTY)),
        (2, Ty::Struct(&EMPTY)),
        (3, Ty::Struct(&EMPTY)),
        (4, Ty::Struct(&EMPTY)),
        (5, Ty::Struct(&DECIMAL_TYPE)),
        (6, Ty::Struct(&EMPTY)),
        (7, Ty::Struct(&TIMESTAMP_TYPE)),
        (8, Ty::Struct(&TIMESTAMP_TYPE)),
        (10, Ty::Struct(&INT_TYPE)),
        (11, Ty::Struct(&EMPTY)),
        (12, Ty::Struct(&EMPTY)),
        (13, Ty::Struct(&EMPTY)),
        (14, Ty::Struct(&EMPTY)),
        (15, Ty::Struct(&EMPTY)),
        (16, Ty::Struct(&VARIANT_TYPE)),
        (17, Ty::Struct(&GEOMETRY_TYPE)),
        (18, Ty::Struct(&GEOGRAPHY_TYPE)),
        (19, Ty::Struct(&EMPTY)),
    ],
};
const SCHEMA_ELEMENT: Desc = Desc {
    name: "SchemaElement",
    fields: &[
        (1, Ty::I32),
        (2, Ty::I32),
        (3, Ty::I32),
        (4, Ty::Binary),
        (5, Ty::I32),
        (6, Ty::I32),
        (7, Ty::I32),
        (8, Ty::I32),
        (9, Ty::I32),
        (10, Ty::Struct(&LOGICAL_TYPE)),
    ],
};
const STATISTICS: Desc = Desc {
    name: "Statistics",
    fields: &[
        (1, Ty::Binary),
        (2, Ty::Binary),
        (3, Ty::I64),
        (4, Ty::I64),
        (5, Ty::Binary),
        (6, Ty::Binary),
        (7, Ty::Bool),
        (8, Ty::Bool),
        (9, Ty::I64),
    ],
};
const PAGE_ENCODING_STATS: Desc = Desc {
    name: "PageEncodingStats",
    fields: &[(1, Ty::I32), (2, Ty::I32), (3, Ty::I32)],
};
const SIZE_STATISTICS: Desc = Desc {
    name: "SizeStatistics",
    fields: &[
        (1, Ty::I64),
        (2, Ty::List(&Ty::I64)),
        (3, Ty::List(&Ty::I64)),
    ],
};
const BOUNDING_BOX: Desc = Desc {
    name: "BoundingBox",
    fields: &[
        (1, Ty::Double),
        (2, Ty::Double),
        (3, Ty::Double),
        (4, Ty::Double),
        (5, Ty::Double),
        (6, Ty::Double),
        (7, Ty::Double),
        (8, Ty::Double),
    ],
};
const GEOSPATIAL_STATISTICS: Desc = Desc {
    name: "GeospatialStatistics",
    fields: &[(1, Ty::Struct(&BOUNDING_BOX)), (2, Ty::List(&Ty::I32))],
};
/// (Fields 3, path_in_schema, and 8, key_value_metadata, the crate skips.)
const COLUMN_META_DATA: Desc = Desc {
    name: "ColumnMetaData",
    fields: &[
        (1, Ty::I32),
        (2, Ty::List(&Ty::I32)),
        (4, Ty::I32),
        (5, Ty::I64),
        (6, Ty::I64),
        (7, Ty::I64),
        (9, Ty::I64),
        (10, Ty::I64),
        (11, Ty::I64),
        (12, Ty::Struct(&STATISTICS)),
        (13, Ty::List(&Ty::Struct(&PAGE_ENCODING_STATS))),
        (14, Ty::I64),
        (15, Ty::I32),
        (16, Ty::Struct(&SIZE_STATISTICS)),
        (17, Ty::Struct(&GEOSPATIAL_STATISTICS)),
    ],
};
const ENCRYPTION_WITH_COLUMN_KEY: Desc = Desc {
    name: "EncryptionWithColumnKey",
    fields: &[(1, Ty::List(&Ty::Binary)), (2, Ty::Binary)],
};
/// A union: the crate reads one field of it and refuses another id or a second field.
const COLUMN_CRYPTO_META_DATA: Desc = Desc {
    name: "ColumnCryptoMetaData",
    fields: &[
        (1, Ty::Struct(&EMPTY)),
        (2, Ty::Struct(&ENCRYPTION_WITH_COLUMN_KEY)),
    ],
};
/// (Fields 8 and 9, encryption, the crate reads only with its `encryption` feature,
/// which a build of cudabuf leaves off but another crate of the same build may turn on:
/// they are described as it reads them, whatever the feature.)
const COLUMN_CHUNK: Desc = Desc {
    name: "ColumnChunk",
    fields: &[
        (1, Ty::Binary),
        (2, Ty::I64),
        (3, Ty::Struct(&COLUMN_META_DATA)),
        (4, Ty::I64),
        (5, Ty::I32),
        (6, Ty::I64),
        (7, Ty::I32),
        (8, Ty::Struct(&COLUMN_CRYPTO_META_DATA)),
        (9, Ty::Binary),
    ],
};
const SORTING_COLUMN: Desc = Desc {
    name: "SortingColumn",
    fields: &[(1, Ty::I32), (2, Ty::Bool), (3, Ty::Bool)],
};
/// (Field 6, total_compressed_size, the crate skips.)
const ROW_GROUP: Desc = Desc {
    name: "RowGroup",
    fields: &[
        (1, Ty::List(&Ty::Struct(&COLUMN_CHUNK))),
        (2, Ty::I64),
        (3, Ty::I64),
        (4, Ty::List(&Ty::Struct(&SORTING_COLUMN))),
        (5, Ty::I64),
        (7, Ty::I16),
    ],
};
const COLUMN_ORDER: Desc = Desc {
    name: "ColumnOrder",
    fields: &[
        (1, Ty::Struct(&EMPTY)),
        (2, Ty::Struct(&EMPTY)),
        (3, Ty::Struct(&EMPTY)),
    ],
};
/// AesGcmV1 and AesGcmCtrV1 alike.
const AES_GCM: Desc = Desc {
    name: "AesGcmV1",
    fields: &[(1, Ty::Binary), (2, Ty::Binary), (3, Ty::Bool)],
};
/// A union (see [`COLUMN_CRYPTO_META_DATA`]).
const ENCRYPTION_ALGORITHM: Desc = Desc {
    name: "EncryptionAlgorithm",
    fields: &[(1, Ty::Struct(&AES_GCM)), (2, Ty::Struct(&AES_GCM))],
};
/// (Field 2, the schema, [`check_schema`] reads itself; fields 8 and 9, encryption, the
/// crate reads only with its `encryption` feature: see [`COLUMN_CHUNK`].)
const FILE_META_DATA: Desc = Desc {
    name: "FileMetaData",
    fields: &[
        (1, Ty::I32),
        (2, Ty::List(&Ty::Struct(&SCHEMA_ELEMENT))),
        (3, Ty::I64),
        (4, Ty::List(&Ty::Struct(&ROW_GROUP))),
        (5, Ty::List(&Ty::Struct(&KEY_VALUE))),
        (6, Ty::Binary),
        (7, Ty::List(&Ty::Struct(&COLUMN_ORDER))),
        (8, Ty::Struct(&ENCRYPTION_ALGORITHM)),
        (9, Ty::Binary),
    ],
};
const DATA_PAGE_HEADER: Desc = Desc {
    name: "DataPageHeader",
    fields: &[
        (1, Ty::I32),
        (2, Ty::I32),
        (3, Ty::I32),
        (4, Ty::I32),
        (5, Ty::Struct(&STATISTICS)),
    ],
};
const DICTIONARY_PAGE_HEADER: Desc = Desc {
    name: "DictionaryPageHeader",
    fields: &[(1, Ty::I32), (2, Ty::I32), (3, Ty::Bool)],
};
const DATA_PAGE_HEADER_V2: Desc = Desc {
    name: "DataPageHeaderV2",
    fields: &[
        (1, Ty::I32),
        (2, Ty::I32),
        (3, Ty::I32),
        (4, Ty::I32),
        (5, Ty::I32),
        (6, Ty::I32),
        (7, Ty::Bool),
        (8, Ty::Struct(&STATISTICS)),
    ],
};
const PAGE_HEADER: Desc = Desc {
    name: "PageHeader",
    fields: &[
        (1, Ty::I32),
        (2, Ty::I32),
        (3, Ty::I32),
        (4, Ty::I32),
        (5, Ty::Struct(&DATA_PAGE_HEADER)),
        (6, Ty::Struct(&EMPTY)),
        (7, Ty::Struct(&DICTIONARY_PAGE_HEADER)),
        (8, Ty::Struct(&DATA_PAGE_HEADER_V2)),
    ],
};

/// The integer fields of a struct read by [`Compact::read_struct`], by id (the last of
/// a repeated field, as the `parquet` crate keeps).
#[derive(Default)]
struct Ints([Option<i64>; 20]);

impl Ints {
    fn get(&self, id: i16) -> Option<i64> {
        self.0.get(usize::try_from(id).ok()?).copied().flatten()
    }

    fn set(&mut self, id: i16, value: Option<i64>) {
        if let (Some(value), Some(slot)) = (
            value,
            usize::try_from(id).ok().and_then(|i| self.0.get_mut(i)),
        ) {
            *slot = Some(value);
        }
    }
}

impl Compact<'_> {
    /// The value of field `id` of `desc`, of compact type `wire`: read as its IDL type
    /// if the crate reads it (which `wire` must then be; an integer's value is
    /// returned), else skipped as `wire`.
    fn field_value(
        &mut self,
        desc: &Desc,
        id: i16,
        wire: u8,
        depth: usize,
    ) -> ThriftResult<Option<i64>> {
        match desc.fields.iter().find(|(f, _)| *f == id) {
            None => self.skip(wire, depth).map(|()| None),
            Some(&(_, ty)) if !ty.matches(wire) => invalid(format!(
                "field {id} of a {} has Thrift type {wire}, not its type {}",
                desc.name,
                ty.name()
            )),
            Some(&(_, ty)) => self.value(ty, depth),
        }
    }

    /// A value of IDL type `ty` (its compact type already checked, or a list's).
    fn value(&mut self, ty: Ty, depth: usize) -> ThriftResult<Option<i64>> {
        if depth > MAX_SKIP_DEPTH {
            return invalid(format!(
                "Thrift values nest more than {MAX_SKIP_DEPTH} deep"
            ));
        }
        match ty {
            Ty::Bool => Ok(None),
            Ty::I8 => self.byte().map(|b| Some(i64::from(b as i8))),
            Ty::I16 | Ty::I64 => self.i64().map(Some),
            Ty::I32 => self.i32().map(|v| Some(i64::from(v))),
            Ty::Double => self.advance(8).map(|()| None),
            Ty::Binary => {
                let n = self.varint()?;
                self.advance(n).map(|()| None)
            }
            Ty::List(elem) => {
                // A list header of 0 is an empty list to the crate, whatever its type.
                if self.buf.get(self.pos) == Some(&0) {
                    self.pos += 1;
                    return Ok(None);
                }
                let (wire, n) = self.list_header()?;
                if !elem.matches(wire) || matches!(elem, Ty::Bool) {
                    return invalid(format!(
                        "a list of {} has elements of Thrift type {wire}",
                        elem.name()
                    ));
                }
                for _ in 0..n {
                    self.value(*elem, depth + 1)?;
                }
                Ok(None)
            }
            Ty::Struct(desc) => self.read_struct(desc, depth + 1).map(|_| None),
        }
    }

    /// A struct `desc`: its integer fields.
    fn read_struct(&mut self, desc: &Desc, depth: usize) -> ThriftResult<Ints> {
        let mut ints = Ints::default();
        let mut last = 0;
        while let Some((id, wire)) = self.field(&mut last)? {
            let value = self.field_value(desc, id, wire, depth)?;
            ints.set(id, value);
        }
        Ok(ints)
    }
}

/// Check the footer of a Parquet file (the Thrift `FileMetaData` in `footer`) before
/// the `parquet` crate reads it:
/// - every field the crate reads, at any depth, is of its IDL type (the crate reads it
///   so whatever type the bytes declare, and skips other fields by the type declared:
///   a field of another type would make it read other bytes than these checks);
/// - the schema, from which the crate builds its tree recursively and with allocations
///   sized by the counts the elements declare: groups may nest at most
///   [`MAX_SCHEMA_DEPTH`] levels below the root, and no group may declare more children
///   than there are elements after it.
pub(super) fn check_schema(footer: &[u8]) -> Result<(), String> {
    let describe = |e: ThriftError| match e {
        ThriftError::Truncated => "it ends inside its metadata".to_string(),
        ThriftError::Invalid(reason) => format!("it is corrupt: {reason}"),
    };
    let mut r = Compact::new(footer);
    let mut last = 0;
    while let Some((id, wire)) = r.field(&mut last).map_err(describe)? {
        if id == 2 {
            // The crate builds a schema tree from every field 2 it meets.
            if wire != LIST {
                return Err(describe(ThriftError::Invalid(format!(
                    "the schema (field 2 of the FileMetaData) has Thrift type {wire}, not list"
                ))));
            }
            check_schema_list(&mut r).map_err(|e| match e {
                SchemaError::Thrift(e) => describe(e),
                SchemaError::Schema(reason) => reason,
            })?;
        } else {
            r.field_value(&FILE_META_DATA, id, wire, 1)
                .map_err(describe)?;
        }
    }
    Ok(())
}

enum SchemaError {
    Thrift(ThriftError),
    Schema(String),
}

impl From<ThriftError> for SchemaError {
    fn from(e: ThriftError) -> Self {
        SchemaError::Thrift(e)
    }
}

/// The schema list of a footer (after its field header): see [`check_schema`].
fn check_schema_list(r: &mut Compact<'_>) -> Result<(), SchemaError> {
    if r.buf.get(r.pos) == Some(&0) {
        r.pos += 1;
        return Ok(());
    }
    let (elem, count) = r.list_header()?;
    if elem != STRUCT {
        return Err(SchemaError::Schema(format!(
            "the footer's schema is a list of Thrift type {elem}, not of structs"
        )));
    }
    // The children still to come of each group open, innermost last.
    let mut open: Vec<u64> = Vec::new();
    for index in 0..count {
        let num_children = r.read_struct(&SCHEMA_ELEMENT, 2)?.get(5);
        // This element is a child of the innermost group open (or a root).
        if let Some(left) = open.last_mut() {
            *left -= 1;
        }
        let after = count - index - 1;
        match num_children {
            Some(n) if n < 0 => {
                return Err(SchemaError::Schema(format!(
                    "schema element {index} declares {n} children"
                )))
            }
            Some(n) if n as u64 > after => {
                return Err(SchemaError::Schema(format!(
                    "schema element {index} declares {n} children; {after} elements follow it"
                )))
            }
            Some(n) if n > 0 => {
                // The root is not a level of nesting; each group below it is.
                if open.len() > MAX_SCHEMA_DEPTH {
                    return Err(SchemaError::Schema(format!(
                        "the schema nests groups more than {MAX_SCHEMA_DEPTH} levels deep (element {index})"
                    )));
                }
                open.push(n as u64);
            }
            _ => {}
        }
        while open.last() == Some(&0) {
            open.pop();
        }
    }
    Ok(())
}

/// What the pre-scan needs of a page header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct PageHeader {
    /// The page type (0 data, 1 index, 2 dictionary, 3 data v2).
    pub(super) kind: i32,
    pub(super) uncompressed_size: i32,
    pub(super) compressed_size: i32,
    /// A dictionary page's values (`None` for other pages).
    pub(super) dictionary_values: Option<i32>,
}

pub(super) const DICTIONARY_PAGE: i32 = 2;

/// Read the page header at the start of `bytes`: the header and its length in bytes.
/// Every field the `parquet` crate reads must be of its IDL type (see [`check_schema`]).
/// [`ThriftError::Truncated`] if `bytes` ends inside it.
pub(super) fn read_page_header(bytes: &[u8]) -> ThriftResult<(PageHeader, usize)> {
    let mut r = Compact::new(bytes);
    let mut last = 0;
    let mut ints = Ints::default();
    let mut dictionary_values = None;
    while let Some((id, wire)) = r.field(&mut last)? {
        if id == 7 && wire == STRUCT {
            dictionary_values = r.read_struct(&DICTIONARY_PAGE_HEADER, 2)?.get(1);
        } else {
            let value = r.field_value(&PAGE_HEADER, id, wire, 1)?;
            ints.set(id, value);
        }
    }
    let as_i32 = |v: Option<i64>| v.and_then(|v| i32::try_from(v).ok());
    let (Some(kind), Some(uncompressed_size), Some(compressed_size)) = (
        as_i32(ints.get(1)),
        as_i32(ints.get(2)),
        as_i32(ints.get(3)),
    ) else {
        return invalid("a page header lacks its type or sizes");
    };
    let dictionary_values = as_i32(dictionary_values);
    if kind == DICTIONARY_PAGE && dictionary_values.is_none() {
        return invalid("a dictionary page header lacks its dictionary_page_header");
    }
    Ok((
        PageHeader {
            kind,
            uncompressed_size,
            compressed_size,
            dictionary_values: if kind == DICTIONARY_PAGE {
                dictionary_values
            } else {
                None
            },
        },
        r.position(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_and_zigzag() {
        let mut r = Compact::new(&[0x03, 0x96, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(r.i64().unwrap(), -2);
        assert_eq!(r.varint().unwrap(), 150);
        assert_eq!(r.i32(), Ok(i32::MIN));
        assert_eq!(r.byte(), Err(ThriftError::Truncated));
        let eleven = [0xffu8; 11];
        assert!(matches!(
            Compact::new(&eleven).varint(),
            Err(ThriftError::Invalid(_))
        ));
    }

    #[test]
    fn skipping_stops_at_the_depth_limit() {
        // A struct whose field 1 is a struct whose field 1 is ... 100 deep.
        let mut bytes = vec![0x1c; 100];
        bytes.extend(std::iter::repeat_n(0, 101));
        let err = Compact::new(&bytes).skip(STRUCT, 0).unwrap_err();
        assert!(matches!(err, ThriftError::Invalid(_)), "{err:?}");
        // 10 deep is fine.
        let mut bytes = vec![0x1c; 10];
        bytes.extend(std::iter::repeat_n(0, 11));
        let mut r = Compact::new(&bytes);
        r.skip(STRUCT, 0).unwrap();
        assert_eq!(r.position(), bytes.len());
    }

    #[test]
    fn a_list_longer_than_its_bytes_is_truncated_at_once() {
        // list<i32> of 2^30 elements in 7 bytes; of 2^40 (past the crate's i32 count).
        let bytes = [0xf5, 0x80, 0x80, 0x80, 0x80, 0x04, 0];
        assert_eq!(
            Compact::new(&bytes).skip(LIST, 0),
            Err(ThriftError::Truncated)
        );
        let bytes = [0xf5, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20, 0];
        assert!(matches!(
            Compact::new(&bytes).skip(LIST, 0),
            Err(ThriftError::Invalid(_))
        ));
    }

    /// Skipping reads the bytes the `parquet` crate's skip reads: booleans in a list take
    /// none, and a field header of type 0 ends a struct whatever its high bits.
    #[test]
    fn skipping_reads_what_the_crate_skips() {
        // list<bool> of 3, then bytes that are not part of it.
        let mut r = Compact::new(&[0x31, 0x15, 0x00]);
        r.skip(LIST, 0).unwrap();
        assert_eq!(r.position(), 1);
        // A struct ended by 0x10 (delta 1, type 0).
        let mut r = Compact::new(&[0x15, 0x02, 0x10, 0xff]);
        r.skip(STRUCT, 0).unwrap();
        assert_eq!(r.position(), 3);
    }

    /// A page header field the crate reads, declared another type, is invalid; one it
    /// does not read (id 9) is skipped by the type declared.
    #[test]
    fn page_header_fields_of_another_type_are_invalid() {
        // type 0, sizes 4 and 4, then `tail`.
        let header = |tail: &[u8]| {
            let mut h = vec![0x15, 0x00, 0x15, 0x08, 0x15, 0x08];
            h.extend_from_slice(tail);
            h
        };
        let (page, len) = read_page_header(&header(&[0x00])).unwrap();
        assert_eq!((page.kind, page.uncompressed_size, len), (0, 4, 7));
        // Field 4 (crc, i32) declared binary; field 5 (a struct) declared i32.
        for tail in [&[0x18, 0x01, 0x00, 0x00][..], &[0x25, 0x02, 0x00]] {
            let err = read_page_header(&header(tail)).unwrap_err();
            assert!(
                matches!(&err, ThriftError::Invalid(m) if m.contains("Thrift type")),
                "{err:?}"
            );
        }
        // Field 9, unknown to the crate, declared binary: skipped.
        let (_, len) = read_page_header(&header(&[0x68, 0x01, 0xaa, 0x00])).unwrap();
        assert_eq!(len, 10);
    }

    /// The schema list of a footer is checked wherever field 2 appears, and must be a
    /// list; an empty footer has nothing to check.
    #[test]
    fn the_schema_field_must_be_a_list() {
        assert_eq!(check_schema(&[0x00]), Ok(()));
        // Field 2 declared i32.
        let err = check_schema(&[0x25, 0x02, 0x00]).unwrap_err();
        assert!(err.contains("Thrift type 5"), "{err}");
        // A schema element whose num_children (field 5) is declared binary.
        let err = check_schema(&[0x29, 0x1c, 0x58, 0x00, 0x00, 0x00]).unwrap_err();
        assert!(err.contains("SchemaElement"), "{err}");
    }

    /// An unknown field (id 100) that is a list of `i32::MAX` booleans, and one that is a
    /// map<bool, bool> of `i32::MAX` entries: 9 bytes each, that the `parquet` crate's
    /// skip loops over for seconds. More booleans than the bytes read are invalid.
    const BOOL_LIST: [u8; 9] = [0x09, 0xc8, 0x01, 0xf1, 0xff, 0xff, 0xff, 0xff, 0x07];
    const BOOL_MAP: [u8; 9] = [0x0b, 0xc8, 0x01, 0xff, 0xff, 0xff, 0xff, 0x07, 0x11];

    #[test]
    fn skipping_booleans_is_bounded_by_the_bytes_read() {
        for field in [BOOL_LIST, BOOL_MAP] {
            // In a footer.
            let mut footer = field.to_vec();
            footer.push(0x00);
            let err = check_schema(&footer).unwrap_err();
            assert!(err.contains("booleans"), "{err}");
            // In a page header (type 0, sizes 4 and 4, then the field).
            let mut header = vec![0x15, 0x00, 0x15, 0x08, 0x15, 0x08];
            header.extend_from_slice(&field);
            header.push(0x00);
            let err = read_page_header(&header).unwrap_err();
            assert!(
                matches!(&err, ThriftError::Invalid(m) if m.contains("booleans")),
                "{err:?}"
            );
        }
        // A few booleans are skipped: a list of 3 and a map of 2 entries, in 6 bytes.
        let mut r = Compact::new(&[0x31, 0x02, 0x11, 0x00, 0x00, 0x00]);
        r.skip(LIST, 0).unwrap();
        r.skip(MAP, 0).unwrap();
        assert_eq!(r.position(), 3);
        // The budget is shared by the whole read: 3 + 3 booleans in 4 bytes are too many.
        let mut r = Compact::new(&[0x31, 0x31, 0x00, 0x00]);
        r.skip(LIST, 0).unwrap();
        assert!(matches!(r.skip(LIST, 0), Err(ThriftError::Invalid(_))));
    }

    /// The encryption fields (8 and 9) of the FileMetaData and ColumnChunk are read as
    /// the crate reads them with its `encryption` feature on (as another crate of the
    /// same build may turn it on), whether it is on or not.
    #[test]
    fn encryption_fields_are_of_their_idl_types() {
        // FileMetaData field 9 (footer_signing_key_metadata, binary) declared i32: the
        // crate would read the varint 0x02 as a length and then 2 bytes.
        let err = check_schema(&[0x95, 0x02, 0x00]).unwrap_err();
        assert!(err.contains("field 9 of a FileMetaData"), "{err}");
        // Field 8 (EncryptionAlgorithm, a struct) declared binary.
        let err = check_schema(&[0x88, 0x01, 0x00, 0x00]).unwrap_err();
        assert!(err.contains("field 8 of a FileMetaData"), "{err}");
        // As their types: an AesGcmV1 of an aad_prefix and a flag, and a binary.
        assert_eq!(
            check_schema(&[0x8c, 0x1c, 0x18, 0x01, 0xaa, 0x21, 0x00, 0x00, 0x18, 0x00, 0x00]),
            Ok(())
        );
        // A ColumnChunk's field 8 (ColumnCryptoMetaData) whose path_in_schema (a list
        // of binary) is declared an i32, in the row groups (field 4) of a footer.
        let footer = [
            0x49, 0x1c, // row groups: a list of 1 struct
            0x19, 0x1c, // its columns: a list of 1 struct
            0x8c, // field 8
            0x2c, // EncryptionWithColumnKey
            0x15, 0x02, // field 1 declared i32
            0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        let err = check_schema(&footer).unwrap_err();
        assert!(err.contains("EncryptionWithColumnKey"), "{err}");
    }
}
