//! Reading models in: Hugging Face folders, GGUF files, tokenizers and chat templates, the built-in
//! models, and pinned downloads.

pub mod builtin;
pub mod checkpoint;
pub mod file_name;
pub mod folder_kind;
pub mod fused_experts;
pub mod gguf;
pub mod hf_config;
pub mod hub;
pub mod load;
pub mod peft;
pub mod peft_pattern;
pub mod tied_head;
pub mod tokenizer;
pub mod wheel;
