//! What the bridge reads during speculative decoding ([`crate::m2r2::bridge`]): the state `h_{p-1}`
//! before each draft row at position `p`. One copy of the rule for both engines (the reference's
//! [`ReferenceSpeculation`](crate::decode::draft_verify::ReferenceSpeculation) and the ONNX
//! runner's backend), so they cannot read different states.
//!
//! ```text
//! h_{p-1} = s_N[p-1]     p-1 verified: kept from the prefill or verify chunk that gave it
//!         = u_gd[p-1]    p-1 drafted in this round: that draft's exit state
//!         = none         p = 0
//! ```

use crate::error::{Error, Result};
use ndarray::{Array1, Array2, ArrayView1};

/// The final slow residuals of the verified positions and the exit states of this round's drafts.
#[derive(Clone, Debug, Default)]
pub struct BridgeMemory {
    /// `[D]` per verified position: its final slow residual `s_N` (`None` where no chunk gave it)
    finals: Vec<Option<Array1<f32>>>,
    /// `[D]` per position `verified..len`: the draft gate's exit state, `None` where the step did
    /// not propose
    exits: Vec<Option<Array1<f32>>>,
}

impl BridgeMemory {
    /// A prefill or verify chunk finished at positions `start..start + m`: its final residuals
    /// `[m, D]` (later positions are forgotten); this round's drafts are forgotten (they are
    /// verified now).
    pub fn verified(&mut self, start: usize, finals: Array2<f32>) {
        self.finals.truncate(start);
        self.finals.resize(start, None);
        self.finals
            .extend(finals.rows().into_iter().map(|r| Some(r.to_owned())));
        self.exits.clear();
    }

    /// A draft step ran at the next position (after the verified ones and earlier drafts), with
    /// its exit state when it proposed.
    pub fn drafted(&mut self, exit_state: Option<Array1<f32>>) {
        self.exits.push(exit_state);
    }

    /// Keep the first `len` positions, `verified` of them verified (a rollback).
    pub fn truncate(&mut self, len: usize, verified: usize) {
        self.finals.truncate(verified);
        self.exits.truncate(len.saturating_sub(verified));
    }

    /// `h_{p-1}` for a draft row at position `p`, `verified` positions being verified.
    pub fn state(&self, p: usize, verified: usize) -> Result<Option<ArrayView1<'_, f32>>> {
        let Some(prev) = p.checked_sub(1) else {
            return Ok(None);
        };
        if prev >= verified {
            return match self.exits.get(prev - verified) {
                Some(Some(u)) => Ok(Some(u.view())),
                _ => Err(Error::Invalid(format!(
                    "the bridge needs the draft's exit state at position {prev}, but no draft \
                     step proposed there"
                ))),
            };
        }
        match self.finals.get(prev) {
            Some(Some(h)) => Ok(Some(h.view())),
            _ => Err(Error::Invalid(format!(
                "the bridge needs the final state of position {prev}, which no verified chunk \
                 gave"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ndarray::array;

    #[test]
    fn reads_verified_finals_then_draft_exits() {
        let mut m = BridgeMemory::default();
        // prefill of positions 0..2
        m.verified(0, array![[1.0, 1.0], [2.0, 2.0]]);
        assert_eq!(m.state(0, 2).unwrap(), None);
        assert_eq!(m.state(2, 2).unwrap().unwrap(), array![2.0, 2.0]);
        // drafts at positions 2 (proposes) and 3 (does not)
        m.drafted(Some(array![5.0, 5.0]));
        assert_eq!(m.state(3, 2).unwrap().unwrap(), array![5.0, 5.0]);
        m.drafted(None);
        assert!(m.state(4, 2).is_err());
        // verify of 2..4, one draft accepted: rollback to 4 positions; the next draft reads s_N[3]
        m.verified(2, array![[3.0, 3.0], [4.0, 4.0]]);
        m.truncate(4, 4);
        assert_eq!(m.state(4, 4).unwrap().unwrap(), array![4.0, 4.0]);
        assert_eq!(m.state(1, 4).unwrap().unwrap(), array![1.0, 1.0]);
        // a rollback before the last chunk (as a timing loop does) still finds s_N[1]
        m.truncate(2, 2);
        assert_eq!(m.state(2, 2).unwrap().unwrap(), array![2.0, 2.0]);
        assert!(m.state(3, 2).is_err(), "position 2 is no longer verified");
        // a chunk after a gap: the positions before it are unknown
        let mut gap = BridgeMemory::default();
        gap.verified(3, array![[7.0, 7.0]]);
        assert!(gap.state(3, 4).is_err());
        assert_eq!(gap.state(4, 4).unwrap().unwrap(), array![7.0, 7.0]);
    }
}
