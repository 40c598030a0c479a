//! The protection conditions the harness compares, and the executor each one builds.

use std::sync::Arc;

use protocol::Engine;
use protocol::{
    DecodeMasks, Executor, MaskKind, MaskedConfig, MaskedExecutor, PlaintextExecutor, Protection, ShieldConfig,
    mask::{self, Family},
};
use serde::Serialize;

/// One column of the attack table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Condition {
    /// Prod: exactly the executor a model service builds by default
    /// ([`Protection::default`]), whatever that is. The gated column.
    Production,
    /// C0: activations in the clear. The control: every attack must succeed here.
    Plain,
    /// C1: fresh Haar mask, no shield rows (leaks the column Gram `HᵀH`).
    MaskOnly,
    /// C2: the masked scheme's default, fresh Haar mask and shield(8, 4.0).
    Default,
    /// C3: HD₃ mask and shield(8, 4.0).
    Hd3,
    /// C3b: blocked HD₃ and shield(8, 4.0).
    Hd3Blocked,
    /// C2s: C2 with shared decode-step masks (opt-in): a decode step's B rows, one per
    /// sequence, under one Haar mask and 8 shield rows. Prefill is C2's.
    SharedDecode,
    /// LPN: the `dual-lpn` protection (opt-in), exactly the executor `--protection dual-lpn`
    /// builds: every linear an int8 product over `Z_{2^32}`, each input row sent as
    /// `x_q + e·H mod 2^32` (one row of words per activation row, no shield rows).
    DualLpn,
}

impl Condition {
    pub const ALL: [Condition; 8] = [
        Condition::Production,
        Condition::Plain,
        Condition::MaskOnly,
        Condition::Default,
        Condition::Hd3,
        Condition::Hd3Blocked,
        Condition::SharedDecode,
        Condition::DualLpn,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Condition::Production => "prod",
            Condition::Plain => "c0",
            Condition::MaskOnly => "c1",
            Condition::Default => "c2",
            Condition::Hd3 => "c3",
            Condition::Hd3Blocked => "c3b",
            Condition::SharedDecode => "c2s",
            Condition::DualLpn => "dual-lpn",
        }
    }

    pub fn parse(s: &str) -> Option<Condition> {
        Condition::ALL.into_iter().find(|c| c.name() == s.trim().to_ascii_lowercase())
    }

    /// Whether the engine receives ring operands (words over `Z_{2^32}`) rather than f32.
    pub fn ring(self) -> bool {
        self == Condition::DualLpn || (self == Condition::Production && Protection::default() == Protection::DualLpn)
    }

    /// The masked executor's settings; `None` for the plaintext control and `dual-lpn`.
    pub fn config(self) -> Option<MaskedConfig> {
        let (mask, shield) = match self {
            Condition::Production => {
                return (Protection::default() == Protection::Masked).then(MaskedConfig::default);
            }
            Condition::Plain | Condition::DualLpn => return None,
            Condition::MaskOnly => (MaskKind::Haar, ShieldConfig::off()),
            Condition::Default | Condition::SharedDecode => (MaskKind::Haar, ShieldConfig::default()),
            Condition::Hd3 => (MaskKind::Hd3, ShieldConfig::default()),
            Condition::Hd3Blocked => (MaskKind::Hd3Blocked, ShieldConfig::default()),
        };
        let decode_masks = if self == Condition::SharedDecode { DecodeMasks::Shared } else { DecodeMasks::PerSequence };
        Some(MaskedConfig { mask, shield, decode_masks, ..MaskedConfig::default() })
    }

    /// Activation rows under each mask of a pass over sequences of `blocks` rows (the
    /// executor's own rule: one block per sequence, or one for a shared decode step).
    pub fn mask_blocks(self, blocks: &[usize]) -> Vec<usize> {
        match self.config() {
            Some(cfg) => cfg.decode_masks.mask_blocks(blocks),
            None => blocks.to_vec(),
        }
    }

    /// Rows the engine receives for a sequence of `n` activation rows.
    pub fn order(self, n: usize) -> usize {
        let Some(cfg) = self.config() else { return n };
        let family = match cfg.mask {
            MaskKind::Haar => Family::Haar,
            MaskKind::Hd3 => Family::Hd3,
            MaskKind::Hd3Blocked => Family::Hd3Blocked,
            MaskKind::Auto => unreachable!("the harness names its mask family"),
        };
        mask::order(family, n, cfg.shield.rows)
    }

    /// The executor model code runs on under this condition.
    pub fn executor(self, engine: Arc<dyn Engine>) -> anyhow::Result<Arc<dyn Executor>> {
        match self {
            Condition::Production => return Ok(Protection::default().executor(engine, MaskedConfig::default())?),
            Condition::DualLpn => return Ok(Protection::DualLpn.executor(engine, MaskedConfig::default())?),
            _ => {}
        }
        Ok(match self.config() {
            None => Arc::new(PlaintextExecutor::new(engine)),
            Some(cfg) => Arc::new(MaskedExecutor::new(engine, cfg)?),
        })
    }
}
