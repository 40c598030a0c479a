//! The in-memory image of the committed store: every document's id, title, metadata and
//! generation, and every chunk's vector as a row of the matrix. Rebuilt from the file at open
//! and updated only after a commit, under the store's write lock, so a search sees exactly
//! one committed state.
//!
//! Chunk text is not kept here: it is read and decrypted from the file for the top-k hits
//! only, which keeps memory at about the size of the vectors.

use std::collections::{BTreeMap, HashMap};

use crate::matrix::Matrix;
use crate::search::{self, Hit};
use crate::seal::{DocHash, Generation};

pub(crate) struct DocEntry {
    pub(crate) hash: DocHash,
    pub(crate) id: String,
    pub(crate) title: String,
    pub(crate) metadata: BTreeMap<String, String>,
    pub(crate) generation: Generation,
    /// Sequence number (table key) of chunk 0; chunk `i` is `first_seq + i`.
    pub(crate) first_seq: u64,
    /// Row of chunk `i` in the matrix.
    pub(crate) rows: Vec<u32>,
}

#[derive(Clone, Copy)]
struct RowOwner {
    doc: u32,
    chunk: u32,
}

pub(crate) struct Index {
    matrix: Matrix,
    /// Who owns each row, so that a moved row can be re-pointed and a hit named.
    owners: Vec<RowOwner>,
    docs: Vec<Option<DocEntry>>,
    free_slots: Vec<u32>,
    by_hash: HashMap<DocHash, u32>,
}

/// A hit resolved to its document and chunk index.
pub(crate) struct ResolvedHit<'a> {
    pub(crate) score: f32,
    pub(crate) doc: &'a DocEntry,
    pub(crate) chunk: u32,
}

impl Index {
    pub(crate) fn new(dim: usize) -> Self {
        Index { matrix: Matrix::new(dim), owners: Vec::new(), docs: Vec::new(), free_slots: Vec::new(), by_hash: HashMap::new() }
    }

    pub(crate) fn dim(&self) -> usize {
        self.matrix.dim()
    }

    pub(crate) fn documents(&self) -> usize {
        self.by_hash.len()
    }

    pub(crate) fn chunks(&self) -> usize {
        self.matrix.len()
    }

    /// Adds a document with no chunks yet (replacing any previous version); chunks follow with
    /// [`Index::push_chunk`] in index order. Returns its slot.
    pub(crate) fn insert_doc(&mut self, mut entry: DocEntry) -> u32 {
        self.remove_doc(&entry.hash);
        entry.rows.clear();
        let hash = entry.hash;
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.docs[slot as usize] = Some(entry);
                slot
            }
            None => {
                self.docs.push(Some(entry));
                (self.docs.len() - 1) as u32
            }
        };
        self.by_hash.insert(hash, slot);
        slot
    }

    #[cfg(test)]
    pub(crate) fn slot_of(&self, hash: &DocHash) -> Option<u32> {
        self.by_hash.get(hash).copied()
    }

    pub(crate) fn entry(&self, slot: u32) -> &DocEntry {
        self.docs[slot as usize].as_ref().expect("slot of a live document")
    }

    /// Appends the next chunk's (unit-norm) vector to the document in `slot`.
    pub(crate) fn push_chunk(&mut self, slot: u32, vector: &[f32]) {
        let row = self.matrix.push(vector) as u32;
        let doc = self.docs[slot as usize].as_mut().expect("slot of a live document");
        let chunk = doc.rows.len() as u32;
        doc.rows.push(row);
        self.owners.push(RowOwner { doc: slot, chunk });
        // An ANN index would add `row` here.
    }

    pub(crate) fn remove_doc(&mut self, hash: &DocHash) -> bool {
        let Some(slot) = self.by_hash.remove(hash) else { return false };
        let Some(entry) = self.docs[slot as usize].take() else { return false };
        self.free_slots.push(slot);
        // Highest rows first: a row about to be removed is then never the one moved into an
        // earlier hole, so each removal only re-points a row that stays.
        let mut rows = entry.rows;
        rows.sort_unstable_by(|a, b| b.cmp(a));
        for row in rows {
            let row = row as usize;
            if let Some(from) = self.matrix.swap_remove(row) {
                let owner = self.owners[from];
                self.owners[row] = owner;
                if let Some(doc) = self.docs[owner.doc as usize].as_mut() {
                    doc.rows[owner.chunk as usize] = row as u32;
                }
                // An ANN index would be told here that `from` is now `row`.
            }
            self.owners.pop();
        }
        true
    }

    /// The `k` best chunks for a unit-norm query, best first. The one place an ANN index would
    /// be consulted instead of the exact scan (see `search`).
    pub(crate) fn top_k(&self, query: &[f32], k: usize) -> Vec<ResolvedHit<'_>> {
        search::exact_top_k(&self.matrix, query, k)
            .into_iter()
            .map(|Hit { score, row }| {
                let owner = self.owners[row as usize];
                ResolvedHit { score, doc: self.entry(owner.doc), chunk: owner.chunk }
            })
            .collect()
    }

    #[cfg(test)]
    pub(crate) fn vector(&self, slot: u32, chunk: u32) -> &[f32] {
        self.matrix.row(self.entry(slot).rows[chunk as usize] as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(h: u8) -> DocEntry {
        DocEntry { hash: [h; 32], id: format!("d{h}"), title: String::new(), metadata: BTreeMap::new(), generation: [0; 16], first_seq: 0, rows: vec![] }
    }

    /// Random inserts, replacements and removals against a plain model: every document's
    /// chunks keep their vectors and the owners table stays consistent.
    #[test]
    fn replace_and_remove_keep_rows_consistent() {
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut index = Index::new(2);
        let mut model: HashMap<u8, Vec<[f32; 2]>> = HashMap::new();
        for step in 0..2000 {
            let h: u8 = rng.random_range(0..20);
            if rng.random_bool(0.3) {
                assert_eq!(index.remove_doc(&[h; 32]), model.remove(&h).is_some());
            } else {
                let n = rng.random_range(0..6);
                let slot = index.insert_doc(entry(h));
                let vs: Vec<[f32; 2]> = (0..n).map(|c| [step as f32, c as f32]).collect();
                for v in &vs {
                    index.push_chunk(slot, v);
                }
                model.insert(h, vs);
            }
        }
        assert_eq!(index.documents(), model.len());
        assert_eq!(index.chunks(), model.values().map(Vec::len).sum::<usize>());
        for (h, vs) in &model {
            let slot = index.slot_of(&[*h; 32]).unwrap();
            assert_eq!(index.entry(slot).rows.len(), vs.len());
            for (c, v) in vs.iter().enumerate() {
                assert_eq!(index.vector(slot, c as u32), &v[..]);
            }
        }
        for (row, owner) in index.owners.iter().enumerate() {
            assert_eq!(index.entry(owner.doc).rows[owner.chunk as usize] as usize, row);
        }
    }
}
