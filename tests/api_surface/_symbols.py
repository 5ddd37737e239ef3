"""The public names the API-surface test compares (megatron-api.md sections 1-12).

Used by tests/api_surface/test_names_and_signatures.py.
"""

# The API map's public names, "module.path:Qualified.name" under megatron.core / gigatron.core.
_PS = "parallel_state:"
_PS_NAMES = """
initialize_model_parallel destroy_model_parallel model_parallel_is_initialized is_initialized
is_unitialized RankGenerator RankGenerator.get_ranks generate_masked_orthogonal_rank_groups
create_group default_embedding_ranks default_position_embedding_ranks get_global_memory_buffer
get_tensor_model_parallel_group get_pipeline_model_parallel_group get_model_parallel_group
get_context_parallel_group get_context_parallel_global_ranks get_embedding_group
get_position_embedding_group get_tensor_and_context_parallel_group
get_tensor_and_data_parallel_group get_data_parallel_group get_data_parallel_group_gloo
get_expert_model_parallel_group get_expert_tensor_parallel_group
get_expert_tensor_and_model_parallel_group get_expert_tensor_model_pipeline_parallel_group
get_expert_data_parallel_group get_expert_data_parallel_group_gloo
get_hierarchical_context_parallel_groups get_amax_reduction_group
get_intra_distributed_optimizer_instance_group get_inter_distributed_optimizer_instance_group
get_tensor_model_parallel_world_size get_tensor_model_parallel_rank
get_pipeline_model_parallel_world_size get_pipeline_model_parallel_rank
get_data_parallel_world_size get_data_parallel_rank get_context_parallel_world_size
get_context_parallel_rank get_tensor_and_context_parallel_world_size
get_tensor_and_context_parallel_rank get_expert_model_parallel_world_size
get_expert_model_parallel_rank get_expert_tensor_parallel_world_size
get_expert_tensor_parallel_rank get_expert_tensor_and_model_parallel_world_size
get_expert_tensor_and_model_parallel_rank get_expert_data_parallel_world_size
get_expert_data_parallel_rank get_virtual_pipeline_model_parallel_world_size
get_virtual_pipeline_model_parallel_rank set_tensor_model_parallel_world_size
set_tensor_model_parallel_rank set_pipeline_model_parallel_world_size
set_pipeline_model_parallel_rank set_expert_model_parallel_world_size
set_expert_model_parallel_rank set_expert_tensor_parallel_world_size
set_expert_tensor_parallel_rank set_virtual_pipeline_model_parallel_world_size
set_virtual_pipeline_model_parallel_rank set_data_parallel_rank is_pipeline_first_stage
is_pipeline_last_stage is_rank_in_embedding_group is_rank_in_position_embedding_group
get_tensor_model_parallel_src_rank get_model_parallel_src_rank get_data_parallel_src_rank
get_pipeline_model_parallel_first_rank get_pipeline_model_parallel_last_rank
get_pipeline_model_parallel_next_rank get_pipeline_model_parallel_prev_rank
get_expert_model_parallel_src_rank"""

_TP = "tensor_parallel:"
_TP_NAMES = """
ColumnParallelLinear ColumnParallelLinear.forward RowParallelLinear RowParallelLinear.forward
VocabParallelEmbedding VocabParallelEmbedding.forward vocab_parallel_cross_entropy
broadcast_data set_tensor_model_parallel_attributes
set_defaults_if_not_set_tensor_model_parallel_attributes copy_tensor_model_parallel_attributes
param_is_not_tensor_parallel_duplicate linear_with_grad_accumulation_and_async_allreduce
copy_to_tensor_model_parallel_region reduce_from_tensor_model_parallel_region
scatter_to_tensor_model_parallel_region gather_from_tensor_model_parallel_region
scatter_to_sequence_parallel_region gather_from_sequence_parallel_region
reduce_scatter_to_sequence_parallel_region all_gather_last_dim_from_tensor_parallel_region
reduce_scatter_last_dim_to_tensor_parallel_region all_to_all all_to_all_sp2hp all_to_all_hp2sp
checkpoint CheckpointWithoutOutput get_cuda_rng_tracker model_parallel_cuda_manual_seed
get_expert_parallel_rng_tracker_name get_data_parallel_rng_tracker_name convert_cuda_rng_state
is_graph_safe_cuda_rng_tracker split_tensor_along_last_dim split_tensor_into_1d_equal_chunks
gather_split_1d_tensor"""

SYMBOLS = (
    [_PS + n for n in _PS_NAMES.split()]
    + [_TP + n for n in _TP_NAMES.split()]
    + [
        "process_groups_config:ProcessGroupCollection",
        "process_groups_config:ProcessGroupCollection.use_mpu_process_groups",
        "process_groups_config:MultiModuleProcessGroupCollection",
        "hyper_comm_grid:HyperCommGrid",
        "hyper_comm_grid:HyperCommGrid.create_pg",
        "hyper_comm_grid:HyperCommGrid.get_pg",
        "hyper_comm_grid:HyperCommGrid.get_rank_enum",
        "tensor_parallel.random:CudaRNGStatesTracker",
        "tensor_parallel.random:CudaRNGStatesTracker.add",
        "tensor_parallel.random:CudaRNGStatesTracker.fork",
        "tensor_parallel.random:CudaRNGStatesTracker.set_states",
        "tensor_parallel.random:CudaRNGStatesTracker.get_states",
        "tensor_parallel.random:CudaRNGStatesTracker.reset",
        "tensor_parallel.utils:VocabUtility.vocab_range_from_per_partition_vocab_size",
        "tensor_parallel.utils:VocabUtility.vocab_range_from_global_vocab_size",
        # 3. pipeline parallel
        "pipeline_parallel.schedules:get_forward_backward_func",
        "pipeline_parallel.schedules:forward_backward_no_pipelining",
        "pipeline_parallel.schedules:forward_backward_pipelining_without_interleaving",
        "pipeline_parallel.schedules:forward_backward_pipelining_with_interleaving",
        "pipeline_parallel.p2p_communication:P2PCommunicator",
        "pipeline_parallel.p2p_communication:P2PCommunicator.recv_forward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.recv_backward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.send_forward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.send_backward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.send_forward_recv_backward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.send_backward_recv_forward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.send_forward_recv_forward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.send_backward_recv_backward",
        "pipeline_parallel.p2p_communication:P2PCommunicator.send_forward_backward_recv_forward_backward",
        # 4. context parallel + utils
        "utils:get_batch_on_this_cp_rank",
        "utils:get_model_config",
        "utils:get_attr_wrapped_model",
        "utils:divide",
        "utils:ensure_divisibility",
        "utils:make_viewless_tensor",
        # 5. transformer
        "model_parallel_config:ModelParallelConfig",
        "transformer.transformer_config:TransformerConfig",
        "transformer.transformer_config:MLATransformerConfig",
        "transformer.spec_utils:ModuleSpec",
        "transformer.spec_utils:build_module",
        "transformer.spec_utils:import_module",
        "transformer.spec_utils:get_submodules",
        "transformer.identity_op:IdentityOp",
        "transformer.identity_op:IdentityFuncOp",
        "transformer.module:MegatronModule",
        "transformer.module:MegatronModule.sharded_state_dict",
        "transformer.module:MegatronModule.set_is_first_microbatch",
        "transformer.transformer_layer:TransformerLayerSubmodules",
        "transformer.transformer_layer:TransformerLayer",
        "transformer.transformer_layer:TransformerLayer.forward",
        "transformer.transformer_layer:TransformerLayer.sharded_state_dict",
        "transformer.transformer_block:TransformerBlockSubmodules",
        "transformer.transformer_block:TransformerBlock",
        "transformer.transformer_block:TransformerBlock.forward",
        "transformer.transformer_block:TransformerBlock.set_input_tensor",
        "transformer.transformer_block:TransformerBlock.sharded_state_dict",
        "transformer.transformer_block:get_num_layers_to_build",
        "transformer.transformer_layer:get_transformer_layer_offset",
        "transformer.attention:SelfAttentionSubmodules",
        "transformer.attention:CrossAttentionSubmodules",
        "transformer.attention:Attention.forward",
        "transformer.attention:SelfAttention",
        "transformer.attention:CrossAttention",
        "transformer.dot_product_attention:DotProductAttention",
        "transformer.dot_product_attention:DotProductAttention.forward",
        "transformer.mlp:MLPSubmodules",
        "transformer.mlp:MLP",
        "transformer.mlp:MLP.forward",
        "transformer.enums:ModelType",
        "transformer.enums:AttnMaskType",
        "transformer.enums:AttnType",
        "transformer.enums:AttnBackend",
        "transformer.enums:LayerType",
        "enums:ModelType",
        "models.gpt.gpt_layer_specs:get_gpt_layer_local_spec",
        "models.gpt.gpt_layer_specs:get_gpt_layer_with_transformer_engine_spec",
        "models.gpt.gpt_layer_specs:get_gpt_decoder_block_spec",
        "models.gpt.gpt_layer_specs:get_gpt_mtp_block_spec",
        "models.gpt.gpt_layer_specs:get_mlp_module_spec",
        "models.gpt.moe_module_specs:get_moe_module_spec",
        # 6. models
        "models.gpt.gpt_model:GPTModel",
        "models.gpt.gpt_model:GPTModel.forward",
        "models.gpt.gpt_model:GPTModel.set_input_tensor",
        "models.gpt.gpt_model:GPTModel.sharded_state_dict",
        "models.common.language_module.language_module:LanguageModule.compute_language_model_loss",
        "models.common.language_module.language_module:LanguageModule.shared_embedding_or_output_weight",
        "models.common.embeddings.language_model_embedding:LanguageModelEmbedding",
        "models.common.embeddings.language_model_embedding:LanguageModelEmbedding.forward",
        "models.common.embeddings.rotary_pos_embedding:RotaryEmbedding",
        "models.common.embeddings.rotary_pos_embedding:RotaryEmbedding.forward",
        "models.bert.bert_model:BertModel",
        "models.bert.bert_model:BertModel.forward",
        "models.T5.t5_model:T5Model",
        "models.T5.t5_model:T5Model.forward",
        # 7. MoE
        "transformer.moe.moe_layer:MoESubmodules",
        "transformer.moe.moe_layer:MoELayer",
        "transformer.moe.moe_layer:MoELayer.forward",
        "transformer.moe.router:TopKRouter",
        "transformer.moe.router:TopKRouter.routing",
        "transformer.moe.router:TopKRouter.forward",
        "transformer.moe.token_dispatcher:MoEAllGatherTokenDispatcher",
        "transformer.moe.token_dispatcher:MoEAlltoAllTokenDispatcher",
        "transformer.moe.token_dispatcher:MoEFlexTokenDispatcher",
        "transformer.moe.experts:SequentialMLP",
        "transformer.moe.experts:TEGroupedMLP",
        "transformer.moe.shared_experts:SharedExpertMLP",
        "transformer.moe.moe_utils:MoEAuxLossAutoScaler",
        "transformer.moe.moe_utils:switch_load_balancing_loss_func",
        "transformer.moe.moe_utils:z_loss_func",
        "transformer.moe.moe_utils:sinkhorn",
        "transformer.moe.moe_utils:topk_softmax_with_capacity",
        # 8. dist_checkpointing
        "dist_checkpointing:save",
        "dist_checkpointing:load",
        "dist_checkpointing:load_common_state_dict",
        "dist_checkpointing:load_tensors_metadata",
        "dist_checkpointing:load_plain_tensors",
        "dist_checkpointing:load_content_metadata",
        "dist_checkpointing:remove_sharded_tensors",
        "dist_checkpointing:check_is_distributed_checkpoint",
        "dist_checkpointing:ShardedTensor",
        "dist_checkpointing:ShardedTensor.from_rank_offsets",
        "dist_checkpointing:ShardedObject",
        "dist_checkpointing:LocalNonpersistentObject",
        "dist_checkpointing.mapping:ShardedTensorFactory",
        "dist_checkpointing.validation:StrictHandling",
        "dist_checkpointing.serialization:get_default_save_sharded_strategy",
        "dist_checkpointing.serialization:get_default_load_sharded_strategy",
        "dist_checkpointing.dict_utils:extract_matching_values",
        "dist_checkpointing.strategies.async_utils:AsyncCallsQueue",
        "dist_checkpointing.strategies.async_utils:AsyncCallsQueue.schedule_async_request",
        "dist_checkpointing.strategies.async_utils:AsyncCallsQueue.maybe_finalize_async_calls",
        "dist_checkpointing.strategies.async_utils:AsyncCallsQueue.close",
        # 9. datasets
        "datasets.indexed_dataset:DType",
        "datasets.indexed_dataset:DType.optimal_dtype",
        "datasets.indexed_dataset:IndexedDataset",
        "datasets.indexed_dataset:IndexedDataset.get",
        "datasets.indexed_dataset:IndexedDataset.exists",
        "datasets.indexed_dataset:IndexedDatasetBuilder",
        "datasets.indexed_dataset:IndexedDatasetBuilder.add_item",
        "datasets.indexed_dataset:IndexedDatasetBuilder.end_document",
        "datasets.indexed_dataset:IndexedDatasetBuilder.add_document",
        "datasets.indexed_dataset:IndexedDatasetBuilder.add_index",
        "datasets.indexed_dataset:IndexedDatasetBuilder.finalize",
        "datasets.blended_megatron_dataset_config:BlendedMegatronDatasetConfig",
        "datasets.gpt_dataset:GPTDatasetConfig",
        "datasets.gpt_dataset:GPTDataset",
        "datasets.gpt_dataset:MockGPTDataset",
        "datasets.gpt_dataset:MockGPTLowLevelDataset",
        "datasets.blended_dataset:BlendedDataset",
        "datasets.blended_megatron_dataset_builder:BlendedMegatronDatasetBuilder",
        "datasets.blended_megatron_dataset_builder:BlendedMegatronDatasetBuilder.build",
        "datasets.utils:get_blend_from_list",
        "datasets.utils:compile_helpers",
        "datasets.utils:normalize",
        "datasets.utils:Split",
        "datasets.megatron_dataset:MegatronDataset",
        "datasets.bert_dataset:BERTMaskedWordPieceDatasetConfig",
        "datasets.t5_dataset:T5MaskedWordPieceDatasetConfig",
        "datasets.masked_dataset:MaskedWordPieceDatasetConfig",
        # 10. optimizer / distributed
        "optimizer.optimizer_config:OptimizerConfig",
        "optimizer:get_megatron_optimizer",
        "optimizer:MegatronOptimizer",
        "optimizer:MegatronOptimizer.step",
        "optimizer:MegatronOptimizer.zero_grad",
        "optimizer:MegatronOptimizer.get_loss_scale",
        "optimizer:MegatronOptimizer.scale_loss",
        "optimizer:MegatronOptimizer.clip_grad_norm",
        "optimizer:MegatronOptimizer.count_zeros",
        "optimizer:MegatronOptimizer.reload_model_params",
        "optimizer:MegatronOptimizer.state_dict",
        "optimizer:MegatronOptimizer.load_state_dict",
        "optimizer:MegatronOptimizer.sharded_state_dict",
        "optimizer:FP32Optimizer",
        "optimizer:Float16OptimizerWithFloat16Params",
        "optimizer:DistributedOptimizer",
        "optimizer:ChainedOptimizer",
        "optimizer:ConstantGradScaler",
        "optimizer:DynamicGradScaler",
        "optimizer_param_scheduler:OptimizerParamScheduler",
        "optimizer_param_scheduler:OptimizerParamScheduler.step",
        "optimizer_param_scheduler:OptimizerParamScheduler.get_lr",
        "distributed:DistributedDataParallel",
        "distributed:DistributedDataParallel.zero_grad_buffer",
        "distributed:DistributedDataParallel.no_sync",
        "distributed:DistributedDataParallel.start_grad_sync",
        "distributed:DistributedDataParallel.finish_grad_sync",
        "distributed:DistributedDataParallel.start_param_sync",
        "distributed:DistributedDataParallel.scale_gradients",
        "distributed:DistributedDataParallel.broadcast_params",
        "distributed:DistributedDataParallel.enable_forward_pre_hook",
        "distributed:DistributedDataParallel.disable_forward_pre_hook",
        "distributed:DistributedDataParallelConfig",
        "distributed.finalize_model_grads:finalize_model_grads",
        "num_microbatches_calculator:init_num_microbatches_calculator",
        "num_microbatches_calculator:get_num_microbatches",
        "num_microbatches_calculator:get_current_global_batch_size",
        "num_microbatches_calculator:update_num_microbatches",
        "num_microbatches_calculator:destroy_num_microbatches_calculator",
        # 11/12. tokenizers, inference, top level
        "tokenizers:MegatronTokenizer",
        "tokenizers:MegatronTokenizer.from_pretrained",
        "inference.sampling_params:SamplingParams",
        "inference_params:InferenceParams",
        "timers:Timers",
        "timers:Timers.log",
        "timers:Timers.get_all_timers_string",
        "timers:Timers.write",
    ]
)

# Re-exports: (alias, canonical). The alias must be the very object at the canonical path (in
# Megatron, as a check of this list, and in gigatron). A canonical without ":" is a module.
REEXPORTS = [
    (
        "pipeline_parallel:get_forward_backward_func",
        "pipeline_parallel.schedules:get_forward_backward_func",
    ),
    ("transformer:TransformerConfig", "transformer.transformer_config:TransformerConfig"),
    ("transformer:ModuleSpec", "transformer.spec_utils:ModuleSpec"),
    ("transformer:MegatronModule", "transformer.module:MegatronModule"),
    ("models.gpt:GPTModel", "models.gpt.gpt_model:GPTModel"),
    ("optimizer:OptimizerConfig", "optimizer.optimizer_config:OptimizerConfig"),
    ("distributed:finalize_model_grads", "distributed.finalize_model_grads:finalize_model_grads"),
    ("tensor_parallel:CheckpointWithoutOutput", "tensor_parallel.random:CheckpointWithoutOutput"),
    (
        "tensor_parallel:model_parallel_cuda_manual_seed",
        "tensor_parallel.random:model_parallel_cuda_manual_seed",
    ),
    ("dist_checkpointing:ShardedTensor", "dist_checkpointing.mapping:ShardedTensor"),
    ("dist_checkpointing:save", "dist_checkpointing.serialization:save"),
    ("dist_checkpointing:load", "dist_checkpointing.serialization:load"),
    (":ModelParallelConfig", "model_parallel_config:ModelParallelConfig"),
    (":DistributedDataParallel", "distributed:DistributedDataParallel"),
    (":InferenceParams", "inference_params:InferenceParams"),
    (":Timers", "timers:Timers"),
    (":parallel_state", "parallel_state"),
    (":mpu", "parallel_state"),
    (":tensor_parallel", "tensor_parallel"),
    (":utils", "utils"),
]
