//! [`IpcMemHandle`] through serde: bytes in binary formats, a hex string in
//! human-readable ones.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::handle::{IpcMemHandle, EXTENDED_HANDLE_LEN};

impl Serialize for IpcMemHandle {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        let bytes = self.to_bytes();
        if serializer.is_human_readable() {
            serializer.serialize_str(&hex::encode(bytes))
        } else {
            serializer.serialize_bytes(&bytes)
        }
    }
}

impl<'de> Deserialize<'de> for IpcMemHandle {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        use serde::de::Error as _;
        let bytes: Vec<u8> = if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            hex::decode(&text).map_err(|e| D::Error::custom(format!("IPC handle: bad hex: {e}")))?
        } else {
            serde_bytes_vec(deserializer)?
        };
        IpcMemHandle::from_bytes(&bytes).map_err(D::Error::custom)
    }
}

/// Deserialize a byte string (or a sequence of bytes, for formats without byte strings).
fn serde_bytes_vec<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<Vec<u8>, D::Error> {
    struct BytesVisitor;
    impl<'de> serde::de::Visitor<'de> for BytesVisitor {
        type Value = Vec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("IPC handle bytes")
        }
        fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> std::result::Result<Vec<u8>, E> {
            Ok(v.to_vec())
        }
        fn visit_byte_buf<E: serde::de::Error>(
            self,
            v: Vec<u8>,
        ) -> std::result::Result<Vec<u8>, E> {
            Ok(v)
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> std::result::Result<Vec<u8>, A::Error> {
            let mut out = Vec::new();
            while let Some(b) = seq.next_element::<u8>()? {
                if out.len() > EXTENDED_HANDLE_LEN {
                    return Err(serde::de::Error::custom("IPC handle: too many bytes"));
                }
                out.push(b);
            }
            Ok(out)
        }
    }
    d.deserialize_byte_buf(BytesVisitor)
}
