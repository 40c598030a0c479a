//! BEIR-format retrieval evaluation: `corpus.jsonl`, `queries.jsonl`, `qrels/test.tsv`;
//! documents embedded as `title + " " + text`, cosine top-100, nDCG@10 (linear gain, as
//! trec_eval computes it) and Recall@100.

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead, BufReader},
    path::Path,
    time::Instant,
};

use serde::Deserialize;

use crate::{
    error::{ModelError, Result, io},
    roles::Embedder,
};

#[derive(Deserialize)]
struct Doc {
    #[serde(rename = "_id")]
    id: String,
    #[serde(default)]
    title: String,
    text: String,
}

/// A BEIR dataset (test split).
pub struct BeirData {
    /// (id, "title text").
    pub corpus: Vec<(String, String)>,
    /// (id, text) of queries that have relevance judgements.
    pub queries: Vec<(String, String)>,
    pub qrels: HashMap<String, HashMap<String, i32>>,
}

fn jsonl(path: &Path) -> Result<Vec<Doc>> {
    let f = std::fs::File::open(path).map_err(io(path))?;
    BufReader::new(f)
        .lines()
        .filter(|l| l.as_ref().map_or(true, |l| !l.trim().is_empty()))
        .map(|l| {
            let l = l.map_err(io(path))?;
            serde_json::from_str(&l).map_err(|source| ModelError::Json { path: path.to_path_buf(), source })
        })
        .collect()
}

impl BeirData {
    pub fn load(dir: &Path) -> Result<Self> {
        let qrels_path = dir.join("qrels/test.tsv");
        let text = std::fs::read_to_string(&qrels_path).map_err(io(&qrels_path))?;
        let mut qrels: HashMap<String, HashMap<String, i32>> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let cols: Vec<&str> = line.split('\t').collect();
            if cols.len() < 3 || (i == 0 && cols[2].parse::<i32>().is_err()) {
                continue; // header or blank
            }
            let score = cols[2]
                .trim()
                .parse::<i32>()
                .map_err(|_| ModelError::Config(format!("{}: line {}", qrels_path.display(), i + 1)))?;
            qrels.entry(cols[0].to_string()).or_default().insert(cols[1].to_string(), score);
        }
        let corpus = jsonl(&dir.join("corpus.jsonl"))?
            .into_iter()
            .map(|d| {
                let text = if d.title.is_empty() { d.text } else { format!("{} {}", d.title, d.text) };
                (d.id, text)
            })
            .collect();
        let queries = jsonl(&dir.join("queries.jsonl"))?
            .into_iter()
            .filter(|q| qrels.contains_key(&q.id))
            .map(|q| (q.id, q.text))
            .collect();
        Ok(BeirData { corpus, queries, qrels })
    }
}

/// Results of one evaluation.
#[derive(Clone, Debug)]
pub struct BeirScores {
    pub ndcg_at_10: f64,
    pub recall_at_100: f64,
    pub queries: usize,
    pub documents: usize,
    pub corpus_seconds: f64,
    pub query_seconds: f64,
}

/// Embeds `texts` in batches of `batch` (longest first, so batches hold similar lengths).
pub fn embed_all(
    embedder: &dyn Embedder,
    texts: &[&str],
    batch: usize,
    mut progress: impl FnMut(usize),
) -> Result<Vec<Vec<f32>>> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(texts[i].len()));
    let mut out = vec![Vec::new(); texts.len()];
    let mut done = 0;
    for chunk in order.chunks(batch.max(1)) {
        let batch_texts: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
        for (&i, v) in chunk.iter().zip(embedder.embed(&batch_texts)?) {
            out[i] = v;
        }
        done += chunk.len();
        progress(done);
    }
    Ok(out)
}

/// Cosine top-`k` of each query against the corpus (embeddings are unit-norm).
pub fn search(queries: &[Vec<f32>], corpus: &[Vec<f32>], k: usize) -> Vec<Vec<(usize, f32)>> {
    use rayon::prelude::*;
    queries
        .par_iter()
        .map(|q| {
            let mut scored: Vec<(usize, f32)> =
                corpus.iter().enumerate().map(|(i, d)| (i, q.iter().zip(d).map(|(a, b)| a * b).sum())).collect();
            let k = k.min(scored.len());
            if k > 0 && k < scored.len() {
                scored.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
                scored.truncate(k);
            }
            scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            scored
        })
        .collect()
}

/// nDCG@10 and Recall@100 of ranked document ids per query.
pub fn metrics(ranked: &BTreeMap<String, Vec<String>>, qrels: &HashMap<String, HashMap<String, i32>>) -> (f64, f64) {
    let (mut ndcg, mut recall, mut n) = (0.0, 0.0, 0usize);
    for (qid, rel) in qrels {
        let Some(docs) = ranked.get(qid) else { continue };
        n += 1;
        let dcg: f64 = docs
            .iter()
            .take(10)
            .enumerate()
            .map(|(i, d)| *rel.get(d).unwrap_or(&0) as f64 / (i as f64 + 2.0).log2())
            .sum();
        let mut ideal: Vec<i32> = rel.values().copied().filter(|&r| r > 0).collect();
        ideal.sort_unstable_by(|a, b| b.cmp(a));
        let idcg: f64 = ideal.iter().take(10).enumerate().map(|(i, &r)| r as f64 / (i as f64 + 2.0).log2()).sum();
        if idcg > 0.0 {
            ndcg += dcg / idcg;
        }
        let relevant = rel.values().filter(|&&r| r > 0).count();
        if relevant > 0 {
            let hit = docs.iter().take(100).filter(|d| rel.get(*d).is_some_and(|&r| r > 0)).count();
            recall += hit as f64 / relevant as f64;
        }
    }
    let n = n.max(1) as f64;
    (ndcg / n, recall / n)
}

/// Full evaluation of an embedder on a dataset.
pub fn evaluate(
    embedder: &dyn Embedder,
    data: &BeirData,
    batch: usize,
    mut progress: impl FnMut(&str, usize, usize),
) -> Result<BeirScores> {
    let t = Instant::now();
    let docs: Vec<&str> = data.corpus.iter().map(|(_, t)| t.as_str()).collect();
    let corpus = embed_all(embedder, &docs, batch, |d| progress("corpus", d, docs.len()))?;
    let corpus_seconds = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let qs: Vec<&str> = data.queries.iter().map(|(_, t)| t.as_str()).collect();
    let queries = embed_all(embedder, &qs, batch, |d| progress("queries", d, qs.len()))?;
    let query_seconds = t.elapsed().as_secs_f64();
    let hits = search(&queries, &corpus, 100);
    let ranked: BTreeMap<String, Vec<String>> = data
        .queries
        .iter()
        .zip(hits)
        .map(|((qid, _), h)| (qid.clone(), h.into_iter().map(|(i, _)| data.corpus[i].0.clone()).collect()))
        .collect();
    let (ndcg_at_10, recall_at_100) = metrics(&ranked, &data.qrels);
    Ok(BeirScores {
        ndcg_at_10,
        recall_at_100,
        queries: data.queries.len(),
        documents: data.corpus.len(),
        corpus_seconds,
        query_seconds,
    })
}

/// Pairwise reranking check: for each of the first `queries` judged queries, the reranker
/// scores the query's first relevant document and one non-relevant document drawn with a
/// seeded generator; returns how often the relevant one scored higher, and how many queries
/// were tried.
pub fn rerank_pairwise(
    reranker: &dyn crate::roles::Reranker,
    data: &BeirData,
    queries: usize,
    seed: u64,
) -> Result<(usize, usize)> {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let index: HashMap<&str, usize> = data.corpus.iter().enumerate().map(|(i, (id, _))| (id.as_str(), i)).collect();
    let (mut wins, mut tried) = (0, 0);
    for (qid, text) in data.queries.iter().take(queries) {
        let rel = &data.qrels[qid];
        let mut relevant: Vec<&String> = rel.iter().filter(|(_, r)| **r > 0).map(|(d, _)| d).collect();
        relevant.sort();
        let Some(pos) = relevant.first().and_then(|d| index.get(d.as_str())) else { continue };
        let neg = loop {
            let i = rng.random_range(0..data.corpus.len());
            if !rel.contains_key(&data.corpus[i].0) {
                break i;
            }
        };
        let scores = reranker.score(text, &[data.corpus[*pos].1.as_str(), data.corpus[neg].1.as_str()])?;
        tried += 1;
        if scores[0] > scores[1] {
            wins += 1;
        }
    }
    Ok((wins, tried))
}
