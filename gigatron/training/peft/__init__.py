"""Parameter-efficient fine-tuning (Megatron-Bridge's `megatron.bridge.peft`): LoRA adapters on
the tensor-parallel linear layers, adapter-only checkpoints, Hugging Face PEFT export."""

from gigatron.training.peft.lora import LoRA, LoRAMerge

__all__ = ["LoRA", "LoRAMerge"]
