//! Public weights resident on the device: registering (packing, budget, upload),
//! unregistering, and looking them up by id.

use std::sync::{Arc, atomic::Ordering};

use protocol::{EngineError, Registered};
use tensor::{Precision, Weight, WeightId};

use super::WgpuEngine;
use crate::weights::{self, GpuWeight};

impl WgpuEngine {
    /// The resident weight `id` names.
    pub(super) fn weight(&self, id: &WeightId) -> Result<Arc<GpuWeight>, EngineError> {
        self.weights
            .read()
            .expect("weight table poisoned")
            .get(id)
            .cloned()
            .ok_or_else(|| EngineError::UnknownWeight(id.clone()))
    }

    /// [`protocol::Engine::register`]: packs `weight` as the configuration says, checks it
    /// against the device's limits and the memory budget, and uploads it.
    pub(super) fn register_weight(&self, id: WeightId, weight: Weight) -> Result<Registered, EngineError> {
        weight.check(&id)?;
        // Quantized blocks are multiplied in f32 here: the exact products of the
        // dequantized weight, which the masked executor checks against.
        let weight = Weight { data: weight.data.widened(), ..weight };
        self.gpu.check_alive()?;
        if self.weights.read().expect("weight table poisoned").contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        let bf16_as = match self.cfg.bf16_weights_as {
            Some(p) => p,
            None if self.gpu.coop => Precision::F16,
            None => Precision::Bf16,
        };
        let storage = weights::storage_for(&weight.data, self.cfg.f32_weights_as, bf16_as);
        let bytes = weights::stored_bytes(&weight, storage);
        let lim = &self.gpu.limits;
        let largest = lim.max_buffer_size.min(lim.max_storage_buffer_binding_size);
        if bytes > largest {
            return Err(EngineError::OutOfMemory(format!(
                "weight `{id}` needs {bytes} bytes; the device's largest buffer binding is {largest}"
            )));
        }
        let budget = self.cfg.memory_budget.or(self.gpu.memory_bytes).unwrap_or(u64::MAX);
        let resident = self.resident.load(Ordering::Relaxed);
        if resident + bytes > budget {
            return Err(EngineError::OutOfMemory(format!(
                "weight `{id}` needs {bytes} bytes; {resident} of the {budget}-byte budget are in use"
            )));
        }
        let (_, contig) = weights::stored_shape(&weight);
        let mut packed = vec![0u8; bytes.next_multiple_of(16) as usize];
        weights::pack_into(&weight, storage, &mut packed[..bytes as usize]);
        let buffer = self.gpu.scoped("register", || {
            self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(id.as_str()),
                // Whole 16-byte words: kernels may view a weight as `vec4`s.
                size: bytes.next_multiple_of(16),
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: true,
            })
        })?;
        {
            let mut view =
                buffer.slice(..).get_mapped_range_mut().map_err(|e| self.gpu.classify("register", e.to_string()))?;
            view.copy_from_slice(&packed);
        }
        buffer.unmap();
        // Start the copy to device memory now rather than with the next product.
        self.gpu.scoped("register", || self.gpu.queue.submit([]))?;
        let w = GpuWeight {
            serial: self.serial.fetch_add(1, Ordering::Relaxed),
            buffer,
            d_in: weight.d_in,
            d_out: weight.d_out,
            layout: weight.layout,
            wtype: weights::wtype(storage),
            ld: weights::stored_ld(contig, storage),
            bytes,
        };
        let mut table = self.weights.write().expect("weight table poisoned");
        if table.contains_key(&id) {
            return Err(EngineError::DuplicateWeight(id));
        }
        table.insert(id, Arc::new(w));
        self.resident.fetch_add(bytes, Ordering::Relaxed);
        Ok(Registered { storage })
    }

    /// [`protocol::Engine::unregister`].
    pub(super) fn unregister_weight(&self, id: &WeightId) -> Result<(), EngineError> {
        // An f32 weight, else an int8 weight of the ring products (the two tables are
        // separate, as the CPU engine's are).
        let f32_bytes = self.weights.write().expect("weight table poisoned").remove(id).map(|w| w.bytes);
        let bytes = match f32_bytes {
            Some(b) => b,
            None => {
                let ring = self.rings.write().expect("ring table poisoned").remove(id);
                ring.ok_or_else(|| EngineError::UnknownWeight(id.clone()))?.bytes
            }
        };
        self.resident.fetch_sub(bytes, Ordering::Relaxed);
        // Idle slots drop their bind groups now; busy ones when they are next taken.
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for s in self.slots.lock().expect("slot pool poisoned").iter_mut() {
            s.groups.clear();
        }
        Ok(())
    }
}
