//! The pool of call buffers: each in-flight call holds a [`Slot`] (upload, input, output
//! and read-back buffers, timestamp queries) and the bind groups cached with it.

use std::{collections::HashMap, num::NonZeroU64, sync::atomic::Ordering};

use protocol::EngineError;

use super::{WgpuEngine, jobs::WSource};
use crate::shaders::PARAMS_BYTES;

/// Idle slots kept for reuse; more concurrent callers than this allocate and free theirs.
const MAX_IDLE_SLOTS: usize = 16;
/// Bind groups a slot keeps (one per weight it has served, plus the dynamic operand).
const MAX_SLOT_GROUPS: usize = 1024;
/// Smallest slot buffer, so that small calls of different sizes share one.
const MIN_SLOT_BYTES: u64 = 1 << 16;

/// The buffers of one in-flight call.
pub(super) struct Slot {
    /// Host-visible, mapped for writing whenever the slot is idle.
    pub(super) up: wgpu::Buffer,
    /// Device-local copy of `up`: parameter blocks (uniform) then operands (storage).
    pub(super) input: wgpu::Buffer,
    in_cap: u64,
    pub(super) output: wgpu::Buffer,
    /// Host-visible read-back of `output` (plus 16 bytes of timestamps).
    pub(super) down: wgpu::Buffer,
    out_cap: u64,
    pub(super) queries: Option<(wgpu::QuerySet, wgpu::Buffer)>,
    pub(super) groups: HashMap<u64, wgpu::BindGroup>,
    epoch: u64,
}

impl WgpuEngine {
    pub(super) fn take_slot(&self, in_bytes: u64, out_bytes: u64) -> Result<Slot, EngineError> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let reuse = {
            let mut idle = self.slots.lock().expect("slot pool poisoned");
            // Prefer a slot that is already large enough.
            let pos = idle.iter().position(|s| s.in_cap >= in_bytes && s.out_cap >= out_bytes);
            match pos {
                Some(i) => Some(idle.swap_remove(i)),
                None => idle.pop(),
            }
        };
        let mut slot = match reuse {
            Some(s) => s,
            None => self.new_slot(in_bytes, out_bytes)?,
        };
        if slot.in_cap < in_bytes || slot.out_cap < out_bytes {
            slot = self.new_slot(in_bytes.max(slot.in_cap), out_bytes.max(slot.out_cap))?;
        }
        if slot.epoch != epoch {
            slot.groups.clear();
            slot.epoch = epoch;
        }
        Ok(slot)
    }

    fn new_slot(&self, in_bytes: u64, out_bytes: u64) -> Result<Slot, EngineError> {
        let in_cap = in_bytes.max(MIN_SLOT_BYTES).next_power_of_two();
        let out_cap = out_bytes.max(MIN_SLOT_BYTES).next_power_of_two();
        let d = &self.gpu.device;
        self.gpu.scoped("allocate call buffers", || {
            let buf = |label, size, usage, mapped| {
                d.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: mapped })
            };
            use wgpu::BufferUsages as U;
            let queries = self.timestamps.then(|| {
                let set = d.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("gelo-timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: 2,
                });
                (set, buf("gelo-resolve", 256, U::QUERY_RESOLVE | U::COPY_SRC, false))
            });
            Slot {
                up: buf("gelo-up", in_cap, U::MAP_WRITE | U::COPY_SRC, true),
                input: buf("gelo-input", in_cap, U::UNIFORM | U::STORAGE | U::COPY_DST, false),
                in_cap,
                output: buf("gelo-output", out_cap, U::STORAGE | U::COPY_SRC, false),
                down: buf("gelo-down", out_cap + 256, U::MAP_READ | U::COPY_DST, false),
                out_cap,
                queries,
                groups: HashMap::new(),
                epoch: self.epoch.load(Ordering::Acquire),
            }
        })
    }

    pub(super) fn put_slot(&self, slot: Slot) {
        let mut idle = self.slots.lock().expect("slot pool poisoned");
        if idle.len() < MAX_IDLE_SLOTS {
            idle.push(slot);
        }
    }

    fn binding_size(&self, cap: u64) -> Option<NonZeroU64> {
        let max = self.gpu.limits.max_storage_buffer_binding_size;
        NonZeroU64::new(cap.min(max) & !3)
    }

    pub(super) fn bind_group(&self, slot: &mut Slot, w: &WSource) -> wgpu::BindGroup {
        if let Some(g) = slot.groups.get(&w.key()) {
            return g.clone();
        }
        let whole = |buffer, cap| {
            wgpu::BindingResource::Buffer(wgpu::BufferBinding { buffer, offset: 0, size: self.binding_size(cap) })
        };
        let w_res = match w {
            // The whole 16-byte words the buffer holds: kernels may view it as `vec4`s.
            WSource::Weight(w) => whole(&w.buffer, w.bytes.next_multiple_of(16)),
            WSource::Ring(w) => whole(&w.buffer, w.bytes),
            WSource::Input => whole(&slot.input, slot.in_cap),
        };
        let g = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("gelo-call"),
            layout: &self.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &slot.input,
                        offset: 0,
                        size: NonZeroU64::new(PARAMS_BYTES),
                    }),
                },
                wgpu::BindGroupEntry { binding: 1, resource: whole(&slot.input, slot.in_cap) },
                wgpu::BindGroupEntry { binding: 2, resource: w_res },
                wgpu::BindGroupEntry { binding: 3, resource: whole(&slot.output, slot.out_cap) },
            ],
        });
        // One group per weight a slot has served: a model's worth (Qwen3-1.7B: 197 weights)
        // stays cached; the earlier cap of 64 was below that, so a decode step recreated them.
        if slot.groups.len() >= MAX_SLOT_GROUPS {
            slot.groups.clear();
        }
        slot.groups.insert(w.key(), g.clone());
        g
    }
}
