//! The runs of a static graph on the buffers bound in place: a [`StaticKv`]'s own steps, a range
//! of its layers, and [`OnnxSession::run_in_place`] under them.

use super::{ATTN_MASK, StaticKv, WRITE_INDICES, attn_mask};
use crate::error::{Error, Result};
use crate::session::{Input, OnnxSession, Outputs, host_outputs};
use crate::step_binding::{StepBinding, bind_in_place};
use ndarray::{Array1, Array2};
use ort::session::RunOptions;
use ort::value::DynTensor;
use std::ops::Range;

impl StaticKv {
    /// Feed `tokens` at positions `len..len + T`; the buffers then hold them. Returns the
    /// graph's other outputs (`logits`) on the host. A step past `L` is refused before running.
    pub fn run(&mut self, session: &mut OnnxSession, tokens: &[u32]) -> Result<Outputs> {
        self.check_room(session.file(), tokens.len())?;
        let t = tokens.len();
        let needed = self.len + t;
        if t == 1 && self.graph.is_some() {
            let outputs = self.run_graph(session, tokens[0])?;
            self.len = needed;
            return Ok(outputs);
        }
        let input_ids = Array2::from_shape_fn((1, t), |(_, i)| i64::from(tokens[i]));
        let position_ids = Array2::from_shape_fn((1, t), |(_, i)| (self.len + i) as i64);
        let write_indices = Array1::from_elem(1, self.len as i64);
        let mask = attn_mask(self.len, t, self.l_max, self.sliding_window);
        let host = [
            ("input_ids", Input::I64(input_ids.view().into_dyn())),
            ("position_ids", Input::I64(position_ids.view().into_dyn())),
            (ATTN_MASK, Input::F32(mask.view().into_dyn())),
            (WRITE_INDICES, Input::I64(write_indices.view().into_dyn())),
        ];
        let outputs = if t == 1 {
            // the one-row decode step: bound once, its tensors reused every step
            if self.step.is_none() {
                let layers = 0..self.buffers.len();
                self.step = Some(Box::new(self.bind_step(session, layers, &host, 1, None)?));
            }
            let step = self.step.as_mut().expect("bound above");
            step.run(session, &host)?
        } else {
            let skip = self.graph.as_ref().map(|g| &g.skip);
            let outputs =
                session.run_in_place(&host, &self.past, &self.present, &mut self.buffers, skip)?;
            if let Some(graph) = &mut self.graph {
                graph.runs.uncaptured += 1;
            }
            outputs
        };
        self.len = needed;
        Ok(outputs)
    }

    /// Run `session`, a graph of `layers`, on `host` inputs (which say where it writes) with those
    /// layers' buffers bound in place; no length is kept (the caller keeps its own: the draft and
    /// verifier layers of a speculative loop fill up to different positions).
    ///
    /// `options`: the run's (`gpu_graph_id` = -1 in a session with CUDA graphs).
    pub fn run_layers(
        &mut self,
        session: &mut OnnxSession,
        layers: Range<usize>,
        host: &[(&str, Input<'_>)],
        options: Option<&RunOptions>,
    ) -> Result<Outputs> {
        let (past, present) = (&self.past[layers.clone()], &self.present[layers.clone()]);
        session.run_in_place(host, past, present, &mut self.buffers[layers], options)
    }

    /// A [`StepBinding`] of `rows` rows of `session`, a graph of `layers`, with inputs shaped as
    /// `host` and those layers' buffers bound in place; `graph_id`: captured as that CUDA graph.
    pub fn bind_step(
        &mut self,
        session: &OnnxSession,
        layers: Range<usize>,
        host: &[(&str, Input<'_>)],
        rows: usize,
        graph_id: Option<&str>,
    ) -> Result<StepBinding> {
        let kv = (
            &self.past[layers.clone()],
            &self.present[layers.clone()],
            &mut self.buffers[layers],
        );
        StepBinding::new(session, host, rows, kv, graph_id)
    }
}

impl OnnxSession {
    /// Run with IoBinding, each of `buffers` bound as the input named in `past` AND the output
    /// named in `present` (the graph writes it in place); `host` inputs are checked and copied in,
    /// every other f32 output comes back to the host.
    pub fn run_in_place(
        &mut self,
        host: &[(&str, Input<'_>)],
        past: &[(String, String)],
        present: &[(String, String)],
        buffers: &mut [(DynTensor, DynTensor)],
        options: Option<&RunOptions>,
    ) -> Result<Outputs> {
        let file = self.file.clone();
        let err = |e: ort::Error| Error::ort(&file, e);
        self.check_host_inputs(host)?;
        let given = |name: &str| {
            host.iter().any(|(n, _)| *n == name) || past.iter().any(|(k, v)| k == name || v == name)
        };
        if let Some(missing) = self.inputs.iter().find(|i| !given(&i.name)) {
            return Err(Error::MissingInput {
                file,
                name: missing.name.clone(),
            });
        }
        let host_memory = OnnxSession::host_output_memory().map_err(err)?;
        let mut binding = self.session.create_binding().map_err(err)?;
        for (name, input) in host {
            binding
                .bind_input(*name, &input.to_tensor().map_err(err)?)
                .map_err(err)?;
        }
        bind_in_place(&mut binding, (past, present, buffers)).map_err(err)?;
        let bound = |name: &str| present.iter().any(|(k, v)| k == name || v == name);
        for info in self.outputs.iter().filter(|o| !bound(&o.name)) {
            binding
                .bind_output_to_device(info.name.as_str(), &host_memory)
                .map_err(err)?;
        }
        let outputs = match options {
            Some(options) => self.session.run_binding_with_options(&binding, options),
            None => self.session.run_binding(&binding),
        }
        .map_err(err)?;
        let tensors = host_outputs(&file, &self.outputs, &outputs, |o| !bound(&o.name))?;
        Ok(Outputs { file, tensors })
    }
}
