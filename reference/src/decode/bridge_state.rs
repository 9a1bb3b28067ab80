//! What the bridge reads during speculative decoding ([`crate::m2r2::bridge`]): the state `h_{p-1}`
//! before each draft row at position `p`. One copy of the rule for both engines (the reference's
//! [`ReferenceSpeculation`](crate::decode::draft_verify::ReferenceSpeculation) and the ONNX
//! runner's backend), so they cannot read different states.
//!
//! ```text
//! h_{p-1} = s_N[p-1]     p-1 verified: a row of the last prefill or verify chunk
//!         = u_gd[p-1]    p-1 drafted in this round: that draft's exit state
//!         = none         p = 0
//! ```

use crate::error::{Error, Result};
use ndarray::{Array1, Array2, ArrayView1};

/// The final slow residuals of the last verified chunk and the exit states of this round's drafts.
#[derive(Clone, Debug, Default)]
pub struct BridgeMemory {
    /// First position of `finals`.
    start: usize,
    /// `[m, D]` the final slow residuals `s_N` of the last prefill or verify chunk
    finals: Array2<f32>,
    /// `[D]` per position `verified..len`: the draft gate's exit state, `None` where the step did
    /// not propose
    exits: Vec<Option<Array1<f32>>>,
}

impl BridgeMemory {
    /// A prefill or verify chunk finished at positions `start..start + m`: its final residuals
    /// `[m, D]`; this round's drafts are forgotten (they are verified now).
    pub fn verified(&mut self, start: usize, finals: Array2<f32>) {
        self.start = start;
        self.finals = finals;
        self.exits.clear();
    }

    /// A draft step ran at the next position (after the verified ones and earlier drafts), with
    /// its exit state when it proposed.
    pub fn drafted(&mut self, exit_state: Option<Array1<f32>>) {
        self.exits.push(exit_state);
    }

    /// Keep the drafts of positions `verified..len` only (a rollback).
    pub fn truncate(&mut self, len: usize, verified: usize) {
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
        match prev
            .checked_sub(self.start)
            .filter(|&i| i < self.finals.nrows())
        {
            Some(i) => Ok(Some(self.finals.row(i))),
            None => Err(Error::Invalid(format!(
                "the bridge needs the final state of position {prev}, which the last verified \
                 chunk (positions {}..{}) does not hold",
                self.start,
                self.start + self.finals.nrows()
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
        assert!(m.state(1, 4).is_err(), "position 0 is no longer held");
    }
}
