//! Plaintext layout of the sealed records: length-prefixed fields, little-endian integers and
//! floats. Decoding checks every length against the buffer, so a record that authenticates but
//! does not decode (a bug, or a future format) is a `Corrupt` error, never a panic.

use std::collections::BTreeMap;

use crate::error::{RecordKind, Result, StoreError};
use crate::seal::Generation;

/// Layout version inside document records; bump with a migration.
const DOC_LAYOUT: u8 = 1;

pub(crate) struct DocRecord {
    pub(crate) generation: Generation,
    /// The document's chunks are the sequence numbers `first_seq .. first_seq + chunks`.
    pub(crate) first_seq: u64,
    pub(crate) chunks: u32,
    pub(crate) id: String,
    pub(crate) title: String,
    pub(crate) metadata: BTreeMap<String, String>,
}

pub(crate) fn encode_doc(doc: &DocRecord) -> Vec<u8> {
    let meta_len: usize = doc.metadata.iter().map(|(k, v)| 8 + k.len() + v.len()).sum();
    let mut out = Vec::with_capacity(1 + 16 + 8 + 4 + 8 + doc.id.len() + doc.title.len() + 4 + meta_len);
    out.push(DOC_LAYOUT);
    out.extend_from_slice(&doc.generation);
    out.extend_from_slice(&doc.first_seq.to_le_bytes());
    out.extend_from_slice(&doc.chunks.to_le_bytes());
    put_str(&mut out, &doc.id);
    put_str(&mut out, &doc.title);
    out.extend_from_slice(&(doc.metadata.len() as u32).to_le_bytes());
    for (k, v) in &doc.metadata {
        put_str(&mut out, k);
        put_str(&mut out, v);
    }
    out
}

pub(crate) fn decode_doc(bytes: &[u8]) -> Result<DocRecord> {
    let mut r = Reader::new(bytes, RecordKind::Document);
    if r.u8()? != DOC_LAYOUT {
        return Err(StoreError::corrupt(RecordKind::Document, "unknown record layout"));
    }
    let mut generation = [0u8; 16];
    generation.copy_from_slice(r.take(16)?);
    let first_seq = r.u64()?;
    let chunks = r.u32()?;
    let id = r.string()?;
    let title = r.string()?;
    let pairs = r.u32()?;
    let mut metadata = BTreeMap::new();
    for _ in 0..pairs {
        let k = r.string()?;
        let v = r.string()?;
        metadata.insert(k, v);
    }
    r.finish()?;
    if first_seq.checked_add(chunks as u64).is_none() {
        return Err(StoreError::corrupt(RecordKind::Document, "chunk range overflows"));
    }
    Ok(DocRecord { generation, first_seq, chunks, id, title, metadata })
}

pub(crate) fn encode_vector(vector: &[f32]) -> Vec<u8> {
    vector.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub(crate) fn decode_vector(bytes: &[u8], out: &mut [f32]) -> Result<()> {
    if bytes.len() != 4 * out.len() {
        return Err(StoreError::corrupt(RecordKind::ChunkVector, "vector of another dimension"));
    }
    for (x, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    Ok(())
}

pub(crate) fn decode_text(bytes: Vec<u8>) -> Result<String> {
    String::from_utf8(bytes).map_err(|_| StoreError::corrupt(RecordKind::ChunkText, "text is not UTF-8"))
}

pub(crate) fn encode_config(dimension: u32) -> Vec<u8> {
    dimension.to_le_bytes().to_vec()
}

pub(crate) fn decode_config(bytes: &[u8]) -> Result<u32> {
    let mut r = Reader::new(bytes, RecordKind::Config);
    let dim = r.u32()?;
    r.finish()?;
    Ok(dim)
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

struct Reader<'a> {
    buf: &'a [u8],
    kind: RecordKind,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], kind: RecordKind) -> Self {
        Reader { buf, kind }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.buf.len() < n {
            return Err(StoreError::corrupt(self.kind, "record shorter than its fields"));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u32()? as usize;
        let bytes = self.take(len)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| StoreError::corrupt(self.kind, "text is not UTF-8"))
    }

    fn finish(&self) -> Result<()> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(StoreError::corrupt(self.kind, "trailing bytes after the record's fields"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doc_roundtrip_and_truncation() {
        let doc = DocRecord {
            generation: [7; 16],
            first_seq: 1 << 40,
            chunks: 3,
            id: "doc-ü".into(),
            title: "Title".into(),
            metadata: [("lang".to_string(), "de".to_string()), ("k".to_string(), String::new())].into(),
        };
        let bytes = encode_doc(&doc);
        let back = decode_doc(&bytes).unwrap();
        assert_eq!(
            (back.generation, back.first_seq, back.chunks, back.id.as_str(), back.title.as_str(), &back.metadata),
            (doc.generation, 1 << 40, 3, "doc-ü", "Title", &doc.metadata)
        );
        for len in 0..bytes.len() {
            assert!(matches!(decode_doc(&bytes[..len]), Err(StoreError::Corrupt { kind: RecordKind::Document, .. })));
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode_doc(&longer).is_err());
    }

    #[test]
    fn vector_and_text_roundtrip() {
        let v = [1.5f32, -0.25, 3.0];
        let bytes = encode_vector(&v);
        let mut out = [0f32; 3];
        decode_vector(&bytes, &mut out).unwrap();
        assert_eq!(out, v);
        for len in 0..bytes.len() {
            assert!(decode_vector(&bytes[..len], &mut out).is_err());
        }
        // A record of another dimension does not decode.
        assert!(decode_vector(&bytes, &mut [0f32; 4]).is_err());
        assert_eq!(decode_text("héllo".as_bytes().to_vec()).unwrap(), "héllo");
        assert!(matches!(decode_text(vec![0xff, 0xfe]), Err(StoreError::Corrupt { kind: RecordKind::ChunkText, .. })));
    }

    mod properties {
        use proptest::prelude::*;

        use super::*;

        type Fields = ([u8; 16], u64, u32, String, String, BTreeMap<String, String>);

        /// A document record's fields (a chunk range that does not overflow, as stored ones have).
        fn fields() -> impl Strategy<Value = Fields> {
            (
                any::<[u8; 16]>(),
                0..u64::MAX / 2,
                any::<u32>(),
                ".{0,40}",
                ".{0,40}",
                prop::collection::btree_map(".{0,12}", ".{0,24}", 0..6),
            )
        }

        fn record(f: Fields) -> DocRecord {
            let (generation, first_seq, chunks, id, title, metadata) = f;
            DocRecord { generation, first_seq, chunks, id, title, metadata }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]

            /// Any record survives its encoding exactly; every shorter prefix and any trailing
            /// byte is refused as corrupt.
            #[test]
            fn any_record_roundtrips_and_no_prefix_decodes(f in fields(), extra in any::<u8>()) {
                let doc = record(f);
                let bytes = encode_doc(&doc);
                let back = decode_doc(&bytes).unwrap();
                prop_assert_eq!(
                    (back.generation, back.first_seq, back.chunks, &back.id, &back.title, &back.metadata),
                    (doc.generation, doc.first_seq, doc.chunks, &doc.id, &doc.title, &doc.metadata)
                );
                for len in 0..bytes.len() {
                    let cut = decode_doc(&bytes[..len]);
                    prop_assert!(matches!(cut, Err(StoreError::Corrupt { .. })), "prefix {} decoded", len);
                }
                let mut longer = bytes.clone();
                longer.push(extra);
                prop_assert!(decode_doc(&longer).is_err());
            }

            /// Arbitrary bytes (what an opened but forged record would hold): a typed result,
            /// never a panic nor an allocation the input's length does not justify.
            #[test]
            fn arbitrary_bytes_never_panic_the_decoders(bytes in prop::collection::vec(any::<u8>(), 0..512), dim in 0usize..64) {
                let _ = decode_doc(&bytes);
                let mut out = vec![0f32; dim];
                let _ = decode_vector(&bytes, &mut out);
                let _ = decode_text(bytes.clone());
                let _ = decode_config(&bytes);
            }

            /// Any eight bytes of a valid record overwritten with any value (a forged length,
            /// count or sequence number): a typed result, never a panic.
            #[test]
            fn forged_lengths_never_panic(f in fields(), at in any::<prop::sample::Index>(), len in any::<u64>()) {
                let mut bytes = encode_doc(&record(f));
                let at = at.index(bytes.len().max(1));
                let forged = len.to_le_bytes();
                for (i, b) in forged.iter().enumerate() {
                    if let Some(slot) = bytes.get_mut(at + i) {
                        *slot = *b;
                    }
                }
                let _ = decode_doc(&bytes);
            }
        }
    }
}
