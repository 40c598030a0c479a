//! Running a call: sizing it, packing the upload, recording and submitting its one command
//! buffer, waiting for the mappings, lending the results out of the read-back, and adding
//! its timings to the engine's [`CallStats`](super::CallStats).

use std::{
    sync::mpsc,
    time::{Duration, Instant},
};

use protocol::EngineError;
use tensor::{Matrix, MatrixView};

use super::{
    WgpuEngine,
    jobs::{Job, to_u32},
    slots::Slot,
};
use crate::shaders::PARAMS_BYTES;

/// Where a call's bytes lie in its slot's buffers.
#[derive(Clone, Copy)]
struct CallBytes {
    /// Start of the parameter blocks in the upload, after the operands.
    params_base: u64,
    /// Bytes uploaded: operands, then parameter blocks.
    in_bytes: u64,
    /// Bytes of results read back.
    out_bytes: u64,
    /// Bytes the kernels write: results, then split-K scratch.
    work_bytes: u64,
    /// Where the two timestamps land in the read-back, after the results.
    ts_offset: u64,
}

impl WgpuEngine {
    /// Runs one call: upload, every dispatch, read-back, one wait.
    pub(super) fn execute(&self, job: Job<'_>) -> Result<Vec<Matrix>, EngineError> {
        self.execute_with(job, true, |views| {
            views
                .iter()
                .map(|z| {
                    // Into a recycled buffer when one is pooled (results are masked data).
                    let mut data = self.buffers.take_empty(z.rows() * z.cols());
                    tensor::cpu::extend_parallel(&mut data, z.as_slice());
                    Matrix::from_vec(z.rows(), z.cols(), data).expect("output sized to its shape")
                })
                .collect()
        })
    }

    /// [`Self::execute`], with the results lent to `read` straight out of the mapped
    /// read-back buffer. `read`'s time counts as read-back only when it is the engine's own
    /// (`ours`: copying results out), not when the caller reads in place.
    pub(super) fn execute_with<R>(
        &self,
        job: Job<'_>,
        ours: bool,
        read: impl FnOnce(&[MatrixView<'_>]) -> R,
    ) -> Result<R, EngineError> {
        self.gpu.check_alive()?;
        let t0 = Instant::now();
        let op = job.op;
        let b = self.call_bytes(&job)?;
        let mut slot = self.take_slot(b.in_bytes, b.work_bytes)?;

        // 1. Pack parameters and operands straight into the mapped upload buffer.
        self.upload(&slot, &job, b)?;

        // 2. One command buffer: upload copy, all dispatches, read-back copy.
        let groups: Vec<wgpu::BindGroup> = job.dispatches.iter().map(|d| self.bind_group(&mut slot, &d.w)).collect();
        let index = self.gpu.scoped(op, || self.submit(&slot, &job, &groups, b))?;
        let t1 = Instant::now();

        // 3. Map the read-back, and the upload buffer again for the slot's next call.
        let down_len = if slot.queries.is_some() { b.ts_offset + 16 } else { b.out_bytes };
        self.map_and_wait(&slot, op, index, down_len)?;
        let t2 = Instant::now();

        // 4. Results lent out of the mapped read-back.
        let (out, gpu_ns, reading) = self.read_back(&slot, &job, b, down_len, ours, read)?;
        slot.down.unmap();
        self.put_slot(slot);
        let t3 = Instant::now() - reading;

        self.record_call(&job, [t0, t1, t2, t3], gpu_ns, b);
        Ok(out)
    }

    /// The call's sizes, refused where they exceed what the device can bind.
    fn call_bytes(&self, job: &Job<'_>) -> Result<CallBytes, EngineError> {
        let op = job.op;
        // Operands first (offsets in the kernels' parameters count from 0), then the
        // parameter blocks at the next dynamic-offset boundary.
        let data_bytes = job.inputs.iter().map(|s| s.len() as u64 * 4).sum::<u64>();
        let params_base = data_bytes.next_multiple_of(PARAMS_BYTES);
        let in_bytes = params_base + job.params.len() as u64;
        // Dynamic offsets are 32-bit.
        to_u32(op, in_bytes as usize)?;
        let out_bytes = (job.out_len as u64 * 4).max(4);
        let work_bytes = ((job.out_len + job.scratch_len) as u64 * 4).max(4);
        let max_binding = self.gpu.limits.max_storage_buffer_binding_size;
        if in_bytes > max_binding || work_bytes > max_binding {
            return Err(EngineError::OutOfMemory(format!(
                "{op}: {in_bytes} bytes in and {out_bytes} out exceed the device's largest binding ({max_binding})"
            )));
        }
        let ts_offset = out_bytes.next_multiple_of(8);
        Ok(CallBytes { params_base, in_bytes, out_bytes, work_bytes, ts_offset })
    }

    /// Step 1: packs the operands, then the parameter blocks, into the mapped upload buffer
    /// and unmaps it.
    fn upload(&self, slot: &Slot, job: &Job<'_>, b: CallBytes) -> Result<(), EngineError> {
        let op = job.op;
        let CallBytes { params_base, in_bytes, .. } = b;
        {
            let mut view = slot
                .up
                .slice(..in_bytes)
                .get_mapped_range_mut()
                .map_err(|e| self.gpu.classify(op, format!("upload buffer not mapped: {e}")))?;
            // Write-only view: the mapping may be write-combining memory, never read back.
            let mut at = 0;
            for s in &job.inputs {
                write_mapped(view.slice(at..at + s.len() * 4), bytemuck::cast_slice(s));
                at += s.len() * 4;
            }
            let base = params_base as usize;
            view.slice(base..base + job.params.len()).copy_from_slice(&job.params);
        }
        slot.up.unmap();
        Ok(())
    }

    /// Step 2: records the upload copy, every dispatch (`job.repeat` times) in one compute
    /// pass, the read-back copy and the timestamps, and submits them.
    fn submit(&self, slot: &Slot, job: &Job<'_>, groups: &[wgpu::BindGroup], b: CallBytes) -> wgpu::SubmissionIndex {
        let op = job.op;
        let CallBytes { params_base, in_bytes, out_bytes, ts_offset, .. } = b;
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
        enc.copy_buffer_to_buffer(&slot.up, 0, &slot.input, 0, in_bytes);
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(op),
                timestamp_writes: slot.queries.as_ref().map(|(set, _)| wgpu::ComputePassTimestampWrites {
                    query_set: set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            for _ in 0..job.repeat.max(1) {
                for (i, (d, g)) in job.dispatches.iter().zip(groups).enumerate() {
                    pass.set_pipeline(&d.pipeline);
                    pass.set_bind_group(0, g, &[(params_base + i as u64 * PARAMS_BYTES) as u32]);
                    pass.dispatch_workgroups(d.groups.0, d.groups.1, d.groups.2);
                }
            }
        }
        enc.copy_buffer_to_buffer(&slot.output, 0, &slot.down, 0, out_bytes);
        if let Some((set, resolve)) = &slot.queries {
            enc.resolve_query_set(set, 0..2, resolve, 0);
            enc.copy_buffer_to_buffer(resolve, 0, &slot.down, ts_offset, 16);
        }
        self.gpu.queue.submit([enc.finish()])
    }

    /// Step 3: maps the upload buffer (for the slot's next call) and the first `down_len`
    /// bytes of the read-back, and waits for submission `index` and both mappings.
    fn map_and_wait(
        &self,
        slot: &Slot,
        op: &'static str,
        index: wgpu::SubmissionIndex,
        down_len: u64,
    ) -> Result<(), EngineError> {
        let (tx, rx) = mpsc::channel();
        let tx2 = tx.clone();
        slot.up.slice(..).map_async(wgpu::MapMode::Write, move |r| {
            let _ = tx.send(r);
        });
        slot.down.slice(..down_len).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx2.send(r);
        });
        for r in self.gpu.wait(index, &rx, 2, self.spin_wait)? {
            r.map_err(|e| self.gpu.classify(op, format!("mapping a call buffer: {e}")))?;
        }
        Ok(())
    }

    /// Step 4: lends the results to `read` out of the mapped read-back. Returns what `read`
    /// returned, the GPU time in ns where the slot has timestamps, and the time `read` took
    /// when it is not the engine's own (`ours`).
    fn read_back<R>(
        &self,
        slot: &Slot,
        job: &Job<'_>,
        b: CallBytes,
        down_len: u64,
        ours: bool,
        read: impl FnOnce(&[MatrixView<'_>]) -> R,
    ) -> Result<(R, Option<u64>, Duration), EngineError> {
        let op = job.op;
        let CallBytes { out_bytes, ts_offset, .. } = b;
        let mut gpu_ns = None;
        let view = slot
            .down
            .slice(..down_len)
            .get_mapped_range()
            .map_err(|e| self.gpu.classify(op, format!("read-back not mapped: {e}")))?;
        if slot.queries.is_some() {
            let ts: Vec<u64> = bytemuck::pod_collect_to_vec(&view[ts_offset as usize..ts_offset as usize + 16]);
            let ticks = ts[1].saturating_sub(ts[0]);
            gpu_ns = Some((ticks as f64 * f64::from(self.gpu.queue.get_timestamp_period())) as u64);
        }
        let bytes = &view[..out_bytes as usize];
        // A mapping is aligned far beyond 4 bytes; copy only if one ever is not.
        let copied;
        let all: &[f32] = match bytemuck::try_cast_slice(bytes) {
            Ok(v) => v,
            Err(_) => {
                copied =
                    bytes.chunks_exact(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect::<Vec<_>>();
                &copied
            }
        };
        let views: Vec<MatrixView<'_>> = job
            .outputs
            .iter()
            .map(|&(off, rows, cols)| {
                MatrixView::new(rows, cols, &all[off..off + rows * cols]).expect("output sized to its shape")
            })
            .collect();
        let r = Instant::now();
        let out = read(&views);
        let reading = if ours { Duration::ZERO } else { r.elapsed() };
        Ok((out, gpu_ns, reading))
    }

    /// Adds one call to the engine's stats: `t` is its start, submission, mapped and done
    /// instants.
    fn record_call(&self, job: &Job<'_>, t: [Instant; 4], gpu_ns: Option<u64>, b: CallBytes) {
        let op = job.op;
        let [t0, t1, t2, t3] = t;
        let CallBytes { in_bytes, out_bytes, .. } = b;
        let mut st = self.stats.lock().expect("stats poisoned");
        st.calls += 1;
        st.host_ns += (t1 - t0).as_nanos() as u64;
        st.wait_ns += (t2 - t1).as_nanos() as u64;
        st.readback_ns += (t3 - t2).as_nanos() as u64;
        if let Some(g) = gpu_ns {
            st.gpu_ns += g;
            st.gpu_timed_calls += 1;
        }
        st.bytes_up += in_bytes;
        st.bytes_down += out_bytes;
        drop(st);
        // Per call, for profiles of a model's stream of calls (shapes only, never data).
        tracing::trace!(target: "gelo::engine::call", op, products = job.outputs.len(),
            rows = job.outputs.first().map_or(0, |o| o.1), cols = job.outputs.iter().map(|o| o.2).sum::<usize>(),
            dispatches = job.dispatches.len(), gpu_us = gpu_ns.map_or(f64::NAN, |g| g as f64 / 1e3),
            wall_us = (t3 - t0).as_secs_f64() * 1e6, "call");
    }
}

/// Bytes from which [`write_mapped`] splits a copy over rayon's pool, and its pieces.
/// Decode calls (at most 1.8 MB: a masked B = 8 step's `down` input) stay on one core: the
/// masked executor draws the next linears' shield rows on the pool during the call, and a
/// caller that waits for its pieces steals those draws (+70 µs a call on the H200, measured).
const PAR_UPLOAD_MIN: usize = 4 << 20;
const UPLOAD_PIECE: usize = 64 << 10;

/// `dst ← src` for a write-only mapped range, in pieces on rayon's pool when large: one
/// core writes mapped (write-combining) memory at ~10 GB/s, and an embedding batch's
/// linear uploads tens of MB while the TEE's other cores wait for the engine.
fn write_mapped(dst: wgpu::WriteOnly<'_, [u8]>, src: &[u8]) {
    use rayon::prelude::*;
    /// A piece of the mapping, handed to one worker.
    struct Piece<'a>(wgpu::WriteOnly<'a, [u8]>);
    // SAFETY: a `WriteOnly<[u8]>` is an exclusive, write-only borrow of bytes, as `&mut [u8]`
    // is, which is `Send`; wgpu only lacks the impl for unsized `T`. The pieces are disjoint.
    unsafe impl Send for Piece<'_> {}
    let mut dst = dst;
    if src.len() < PAR_UPLOAD_MIN || rayon::current_num_threads() < 2 {
        dst.copy_from_slice(src);
        return;
    }
    let mut pieces = Vec::with_capacity(src.len().div_ceil(UPLOAD_PIECE));
    let (mut rest, mut from) = (dst, src);
    while from.len() > UPLOAD_PIECE {
        let (head, tail) = rest.split_at(UPLOAD_PIECE);
        pieces.push((Piece(head), &from[..UPLOAD_PIECE]));
        rest = tail;
        from = &from[UPLOAD_PIECE..];
    }
    pieces.push((Piece(rest), from));
    pieces.into_par_iter().for_each(|(mut piece, bytes)| piece.0.copy_from_slice(bytes));
}
