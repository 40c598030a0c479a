//! The in-memory image of the committed store: every document's id, title, metadata and
//! generation, and every chunk's vector as a row of the matrix. Rebuilt from the file at open
//! and updated only after a commit, under the store's write lock, so a search sees exactly
//! one committed state.
//!
//! Chunk text is not kept here: it is read and decrypted from the file for the top-k hits
//! only, which keeps memory at about the size of the vectors.
//!
//! Above a configured chunk count ([`crate::StoreOptions::ann_threshold`]) searches go through an IVF index
//! (`ivf`) instead of the exact scan. The index is told about every row this module moves, so
//! it never needs a rebuild to stay correct, only to stay good. A build also reorders the
//! matrix so that each IVF list's rows are adjacent (re-pointing owners and documents, as a
//! removal does), which is what makes a probe read runs of memory; the exact scan is
//! indifferent to row order except among exactly equal scores, which it orders by row. It is
//! built by
//! [`Index::refresh_ann`] once the count passes the threshold, rebuilt when the count has
//! doubled since the last build (rows added later join centroids trained without them), and
//! dropped when the count falls to half the threshold (kept in between, so that a store
//! hovering at the threshold does not rebuild on every commit).

use std::collections::{BTreeMap, HashMap};

use crate::StoreOptions;
use crate::ivf::Ivf;
use crate::matrix::Matrix;
use crate::seal::{DocHash, Generation};
use crate::search::{self, Hit};

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
    /// When searches use the IVF index, and how many of its lists they read.
    ann: StoreOptions,
    ivf: Option<Ivf>,
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
    #[cfg(test)]
    pub(crate) fn new(dim: usize) -> Self {
        Self::with_ann(dim, StoreOptions { ann_threshold: usize::MAX, nprobe: 1 })
    }

    /// An empty index; `ann.nprobe` must be at least 1 (`EncryptedRedbStore::open_with`
    /// checks it).
    pub(crate) fn with_ann(dim: usize, ann: StoreOptions) -> Self {
        Index {
            matrix: Matrix::new(dim),
            ann,
            ivf: None,
            owners: Vec::new(),
            docs: Vec::new(),
            free_slots: Vec::new(),
            by_hash: HashMap::new(),
        }
    }

    /// Builds, rebuilds or drops the IVF index for the current chunk count (see the module
    /// doc). Called after each batch of changes rather than per row, so that loading or
    /// ingesting many rows builds once. A build runs under the store's write lock: at 1M
    /// chunks it takes seconds (docs/BENCHMARKS.md), once per doubling of the store.
    pub(crate) fn refresh_ann(&mut self) {
        let n = self.chunks();
        if n <= self.ann.ann_threshold / 2 {
            self.ivf = None;
        } else if n > self.ann.ann_threshold
            && self.ivf.as_ref().is_none_or(|ivf| n >= ivf.built_for().saturating_mul(2))
        {
            let mut ivf = Ivf::build(&self.matrix);
            let order = ivf.make_contiguous();
            self.permute(&order);
            self.ivf = Some(ivf);
        }
    }

    /// Moves rows so that row `i` is the former row `order[i]`, re-pointing their owners.
    fn permute(&mut self, order: &[u32]) {
        self.matrix.permute(order);
        self.owners = order.iter().map(|&from| self.owners[from as usize]).collect();
        for (row, owner) in self.owners.iter().enumerate() {
            if let Some(doc) = self.docs[owner.doc as usize].as_mut() {
                doc.rows[owner.chunk as usize] = row as u32;
            }
        }
    }

    /// Whether searches currently go through the IVF index.
    fn uses_ann(&self) -> bool {
        self.chunks() > self.ann.ann_threshold && self.ivf.is_some()
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
        if let Some(ivf) = &mut self.ivf {
            ivf.push(row, vector);
        }
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
            let moved = self.matrix.swap_remove(row);
            if let Some(ivf) = &mut self.ivf {
                ivf.swap_remove(row, moved);
            }
            if let Some(from) = moved {
                let owner = self.owners[from];
                self.owners[row] = owner;
                if let Some(doc) = self.docs[owner.doc as usize].as_mut() {
                    doc.rows[owner.chunk as usize] = row as u32;
                }
            }
            self.owners.pop();
        }
        true
    }

    /// The `k` best chunks for a unit-norm query, best first: by the exact scan, or above the
    /// threshold by the IVF index, whose hits carry the same exact scores (see `search`).
    pub(crate) fn top_k(&self, query: &[f32], k: usize) -> Vec<ResolvedHit<'_>> {
        let hits = match &self.ivf {
            Some(ivf) if self.uses_ann() => ivf.top_k(&self.matrix, query, k, self.ann.nprobe),
            _ => search::exact_top_k(&self.matrix, query, k),
        };
        hits.into_iter()
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
        DocEntry {
            hash: [h; 32],
            id: format!("d{h}"),
            title: String::new(),
            metadata: BTreeMap::new(),
            generation: [0; 16],
            first_seq: 0,
            rows: vec![],
        }
    }

    use crate::random_unit as unit;

    /// Built once past the threshold, rebuilt at twice the size of the last build, kept down
    /// to half the threshold and used only above it.
    #[test]
    fn the_ivf_index_follows_the_threshold() {
        use rand::SeedableRng;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
        let mut index = Index::with_ann(4, StoreOptions { ann_threshold: 100, nprobe: 2 });
        let mut add = |index: &mut Index, h: u8, n: usize| {
            let slot = index.insert_doc(entry(h));
            for _ in 0..n {
                index.push_chunk(slot, &unit(&mut rng, 4));
            }
            index.refresh_ann();
        };
        add(&mut index, 0, 100);
        assert!(index.ivf.is_none() && !index.uses_ann(), "at the threshold: exact");
        add(&mut index, 1, 1);
        assert_eq!(index.ivf.as_ref().map(Ivf::built_for), Some(101));
        assert!(index.uses_ann());
        add(&mut index, 2, 100);
        assert_eq!(index.ivf.as_ref().map(Ivf::built_for), Some(101), "201 < 2 × 101: no rebuild");
        add(&mut index, 3, 1);
        assert_eq!(index.ivf.as_ref().map(Ivf::built_for), Some(202));
        assert_eq!(index.ivf.as_ref().map(Ivf::lists), Some(14));
        // 102 chunks left, then 101: still above the threshold and served by the index built
        // for 202 (which followed the removals).
        index.remove_doc(&[2; 32]);
        index.refresh_ann();
        assert!(index.uses_ann());
        index.remove_doc(&[3; 32]);
        index.refresh_ann();
        assert!(index.uses_ann() && index.chunks() == 101);
        // 100: at the threshold, exact again, but the index is kept...
        index.remove_doc(&[1; 32]);
        index.refresh_ann();
        assert!(index.ivf.is_some() && !index.uses_ann());
        // ...until half the threshold.
        let slot = index.slot_of(&[0; 32]).unwrap();
        let entry0 = index.entry(slot);
        assert_eq!(entry0.rows.len(), 100);
        index.remove_doc(&[0; 32]);
        index.refresh_ann();
        assert!(index.ivf.is_none() && index.chunks() == 0);
    }

    /// Above the threshold, after replacements and removals that move rows: a removed
    /// document is never returned, and every hit names the chunk whose vector it scored.
    #[test]
    fn ann_hits_stay_correct_under_row_moves() {
        use rand::{RngExt, SeedableRng};
        let dim = 8;
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let mut index = Index::with_ann(dim, StoreOptions { ann_threshold: 50, nprobe: 3 });
        let mut live: HashMap<u8, Vec<Vec<f32>>> = HashMap::new();
        for step in 0..600 {
            let h: u8 = rng.random_range(0..60);
            if rng.random_bool(0.3) {
                index.remove_doc(&[h; 32]);
                live.remove(&h);
            } else {
                let slot = index.insert_doc(entry(h));
                let vs: Vec<Vec<f32>> = (0..rng.random_range(1..8)).map(|_| unit(&mut rng, dim)).collect();
                for v in &vs {
                    index.push_chunk(slot, v);
                }
                live.insert(h, vs);
            }
            index.refresh_ann();
            if step % 50 == 49 {
                assert!(index.uses_ann(), "{} chunks", index.chunks());
                for q in (0..5).map(|_| unit(&mut rng, dim)) {
                    let hits = index.top_k(&q, 10);
                    assert_eq!(hits.len(), 10);
                    for hit in hits {
                        let vs = live.get(&hit.doc.hash[0]).expect("a removed document was returned");
                        let v = &vs[hit.chunk as usize];
                        assert_eq!(hit.score.to_bits(), search::dot(&q, v).to_bits());
                    }
                }
            }
        }
        // The rebuilds permuted the rows: every chunk still has its vector and owner.
        for (h, vs) in &live {
            let slot = index.slot_of(&[*h; 32]).unwrap();
            for (c, v) in vs.iter().enumerate() {
                assert_eq!(index.vector(slot, c as u32), &v[..]);
            }
        }
        for (row, owner) in index.owners.iter().enumerate() {
            assert_eq!(index.entry(owner.doc).rows[owner.chunk as usize] as usize, row);
        }
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
