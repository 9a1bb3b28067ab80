//! PEFT's per-module ranks and alphas: the `rank_pattern` and `alpha_pattern` objects of
//! `adapter_config.json`, which override `r` and `lora_alpha` for some modules.
//!
//! Each key is a regular expression matched against a module's name in the base model
//! (`model.layers.3.self_attn.q_proj`, see [`module_name`]). It applies where `(.*\.)?(KEY)$`
//! matches from the start of the name, so `q_proj` names every query projection and
//! `layers.3.mlp.up_proj` one map of one layer. Keys are tried in file order and the first that
//! matches wins; a module that no key matches keeps `r` / `lora_alpha`. This is PEFT's
//! `get_pattern_key` (peft/utils/other.py).
//!
//! We write one key per module whose rank or alpha differs from the default, its full name.

use crate::base::weight_names::Target;
use regex::Regex;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::Value;
use std::fmt;

/// The name of the linear map `target` of code layer `layer` in the base model, as PEFT's
/// patterns see it.
pub fn module_name(layer: usize, target: Target) -> String {
    format!(
        "model.layers.{layer}.{}.{}",
        target.parent(),
        target.module()
    )
}

/// A JSON object's `(key, value)` entries in file order.
pub type Entries = Vec<(String, Value)>;

/// One `*_pattern` object: keys in file order, each with its compiled regex and value.
#[derive(Clone, Debug)]
pub struct Pattern<T> {
    entries: Vec<(String, Regex, T)>,
}

impl<T: Copy> Pattern<T> {
    /// Compile the `(key, value)` pairs of one pattern object, in file order. `parse` turns a JSON
    /// value into `T` or says what it expected. Errors name the key.
    pub fn compile(
        pairs: Entries,
        parse: impl Fn(&Value) -> Option<T>,
        expected: &str,
    ) -> Result<Self, String> {
        let mut entries = Vec::with_capacity(pairs.len());
        for (key, value) in pairs {
            let Some(v) = parse(&value) else {
                return Err(format!("key `{key}`: expected {expected}, got {value}"));
            };
            let re = Regex::new(&format!(r"^(?:.*\.)?(?:{key})$"))
                .map_err(|e| format!("key `{key}` is not a regular expression we can read: {e}"))?;
            entries.push((key, re, v));
        }
        Ok(Pattern { entries })
    }

    /// The value of the first key that matches `module` (a [`module_name`]), if any.
    pub fn get(&self, module: &str) -> Option<T> {
        self.entries
            .iter()
            .find(|(_, re, _)| re.is_match(module))
            .map(|&(_, _, v)| v)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// `rank_pattern` and `alpha_pattern` as `(key, value)` pairs in file order (`serde_json::Map`
/// sorts its keys, and PEFT's first-match rule needs the order). Absent or null is empty.
pub fn read_ordered(text: &str) -> serde_json::Result<(Entries, Entries)> {
    #[derive(serde::Deserialize)]
    struct Patterns {
        #[serde(default)]
        rank_pattern: Option<Ordered>,
        #[serde(default)]
        alpha_pattern: Option<Ordered>,
    }
    let p: Patterns = serde_json::from_str(text)?;
    let pairs = |o: Option<Ordered>| o.map(|o| o.0).unwrap_or_default();
    Ok((pairs(p.rank_pattern), pairs(p.alpha_pattern)))
}

/// A JSON object's entries in file order.
struct Ordered(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Ordered {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Ordered;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object of module name patterns")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Ordered, M::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry::<String, Value>()? {
                    entries.push(entry);
                }
                Ok(Ordered(entries))
            }
        }
        d.deserialize_map(Entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::weight_names::{AttnProj, MlpProj};

    fn rank_pattern(text: &str) -> Pattern<usize> {
        let (pairs, _) = read_ordered(text).unwrap();
        Pattern::compile(pairs, |v| v.as_u64().map(|r| r as usize), "a rank").unwrap()
    }

    #[test]
    fn module_names_are_the_base_models() {
        assert_eq!(
            module_name(3, Target::Attn(AttnProj::Q)),
            "model.layers.3.self_attn.q_proj"
        );
        assert_eq!(
            module_name(12, Target::Mlp(MlpProj::Down)),
            "model.layers.12.mlp.down_proj"
        );
    }

    /// PEFT's rule by hand: a key matches a whole dotted suffix of the name, and the first key in
    /// file order wins.
    #[test]
    fn suffix_match_and_first_key_wins() {
        let p = rank_pattern(
            r#"{"rank_pattern": {"layers.1.self_attn.q_proj": 4, "q_proj": 8,
                "layers\\.(2|3)\\..*": 2}, "r": 16}"#,
        );
        let q = Target::Attn(AttnProj::Q);
        let up = Target::Mlp(MlpProj::Up);
        assert_eq!(p.get(&module_name(1, q)), Some(4));
        // "layers.1.self_attn.q_proj" must match a whole dotted suffix: not layer 11's.
        assert_eq!(p.get(&module_name(11, q)), Some(8));
        // File order: "q_proj" comes before the layer 2-3 key.
        assert_eq!(p.get(&module_name(2, q)), Some(8));
        assert_eq!(p.get(&module_name(2, up)), Some(2));
        assert_eq!(p.get(&module_name(4, up)), None);
        // "proj" is not a whole suffix ("q_proj" is), so it matches nothing.
        assert_eq!(
            rank_pattern(r#"{"rank_pattern": {"proj": 4}}"#).get(&module_name(0, q)),
            None
        );
        // The reverse file order gives the other answer for layer 2's q_proj.
        let p = rank_pattern(r#"{"rank_pattern": {"layers\\.(2|3)\\..*": 2, "q_proj": 8}}"#);
        assert_eq!(p.get(&module_name(2, q)), Some(2));
    }

    #[test]
    fn absent_null_and_bad_patterns() {
        assert!(rank_pattern("{}").is_empty());
        assert!(rank_pattern(r#"{"rank_pattern": null, "alpha_pattern": {}}"#).is_empty());
        assert!(read_ordered(r#"{"rank_pattern": [1]}"#).is_err());
        let (pairs, _) = read_ordered(r#"{"rank_pattern": {"q_proj": "eight"}}"#).unwrap();
        let e = Pattern::compile(pairs, |v| v.as_u64(), "a positive integer").unwrap_err();
        assert!(
            e.contains("key `q_proj`: expected a positive integer"),
            "{e}"
        );
        let (pairs, _) = read_ordered(r#"{"rank_pattern": {"q_proj(": 8}}"#).unwrap();
        let e = Pattern::compile(pairs, |v| v.as_u64(), "a rank").unwrap_err();
        assert!(
            e.contains("key `q_proj(` is not a regular expression"),
            "{e}"
        );
    }
}
