"""LoRA (Megatron-Bridge's names) on a Hugging Face Llama loaded into GPTModel: at TP 2 (with and
without sequence parallelism) the per-token losses and every adapter gradient equal the one-rank
run's, the base weights get no gradient; merging the adapters into the base weights keeps the
output; at PP 2 the adapters carry their global layer names and the same initial values; the
adapter-only checkpoint loads back; the PEFT export loaded by `peft` onto the transformers model
gives gigatron's logits."""

import pytest
import torch

from gigatron.testing import run_distributed
from tests._one_rank import one_rank_fixtures
from tests.training.test_pretrain_sft import make_llama_dir

pytestmark = pytest.mark.multirank
transformers = pytest.importorskip("transformers")
gloo_world = one_rank_fixtures()[0]  # the one-rank reference runs in this process

LORA = dict(dim=4, alpha=8, lora_B_init_method="normal", seed=5)
B, S = 2, 12


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 47, (B, S), generator=g), torch.randint(0, 47, (B, S), generator=g)


def _model(hf_dir, tp=1, pp=1, sp=False):
    from gigatron.convert import load_hf_into_model, read_hf_config, spec_from_hf_config
    from gigatron.core import parallel_state as ps
    from gigatron.core import tensor_parallel

    ps.initialize_model_parallel(tp, pp)
    tensor_parallel.model_parallel_cuda_manual_seed(7)
    spec = spec_from_hf_config(read_hf_config(hf_dir))  # 128 vocabulary rows at TP 1 and 2
    model = spec.build_model(
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, sequence_parallel=sp,
        pre_process=ps.is_pipeline_first_stage(), post_process=ps.is_pipeline_last_stage(),
        pipeline_dtype=torch.float32,
    )  # fmt: skip
    load_hf_into_model([model], hf_dir)
    return model


def _losses_and_grads(hf_dir, tp, sp=False):
    """Per-token losses [B, S], whole adapter grads, base params with a grad, merged losses."""
    from gigatron.core import parallel_state as ps
    from gigatron.training.peft import LoRA, LoRAMerge
    from gigatron.training.peft.adapter_io import adapter_state_dict
    from gigatron.training.peft.lora import adapted_layers

    model = LoRA(**LORA)(_model(hf_dir, tp, sp=sp))
    assert not [k for k in model.sharded_state_dict() if ".adapter." in k]  # base keys only
    ids, labels = _batch()
    loss = model(ids, None, None, labels=labels)
    loss.sum().backward()
    grads = {}
    for name, layer in adapted_layers(model):
        for part in ("linear_in", "linear_out"):
            w = getattr(layer.adapter, part).weight
            grad = w.grad
            if getattr(w, "sequence_parallel", False):  # finalize_model_grads' all-reduce
                grad = grad.clone()
                torch.distributed.all_reduce(grad, group=layer.adapter.tp_group)
            grads[f"{name}.{part}"] = layer.adapter.gather(part, grad)
    based = [n for n, p in model.named_parameters() if p.grad is not None and ".adapter." not in n]
    adapters = adapter_state_dict(model)
    with torch.no_grad():
        adapters["logits"] = model(ids, None, None)[..., :47]  # the vocabulary, not its padding
        merged = LoRAMerge()(model)(ids, None, None, labels=labels)
    assert not any(".adapter." in n for n, _ in model.named_parameters())
    ps.destroy_model_parallel()
    return loss.detach(), grads, based, merged, adapters


def test_lora_dropout_draws_masks_in_training_only(tmp_path):
    from gigatron.core import parallel_state as ps
    from gigatron.training.peft import LoRA

    make_llama_dir(str(tmp_path), seed=2)
    model = LoRA(dim=4, alpha=8, dropout=0.5, lora_B_init_method="normal")(_model(str(tmp_path)))
    ids, _ = _batch()
    with torch.no_grad():
        train_a, train_b = model(ids, None, None), model(ids, None, None)
        model.eval()
        eval_a, eval_b = model(ids, None, None), model(ids, None, None)
    ps.destroy_model_parallel()
    assert (train_a - train_b).abs().max() > 1e-4 and (train_a - eval_a).abs().max() > 1e-4
    torch.testing.assert_close(eval_a, eval_b, atol=0, rtol=0)


def _tp2_and_pp2(hf_dir, ckpt):
    from gigatron.core import parallel_state as ps
    from gigatron.training.peft import LoRA
    from gigatron.training.peft.adapter_io import adapter_state_dict, load_adapters, save_adapters

    out = {"tp2": _losses_and_grads(hf_dir, 2), "tp2_sp": _losses_and_grads(hf_dir, 2, sp=True)}
    model = LoRA(**LORA)(_model(hf_dir, pp=2))
    out["pp2_adapters"] = adapter_state_dict(model)
    save_adapters(model, LoRA(**LORA), ckpt)
    torch.distributed.barrier()
    ps.destroy_model_parallel()
    fresh = LoRA(dim=4, alpha=8, seed=99)(_model(hf_dir, tp=2))  # other values, then loaded
    load_adapters(fresh, ckpt)
    out["tp2_loaded"] = adapter_state_dict(fresh)
    ps.destroy_model_parallel()
    return out


def test_lora_tp2_sp_pp2_match_one_rank_merge_and_peft_export(tmp_path):
    hf_dir, ckpt, peft_dir = str(tmp_path / "hf"), str(tmp_path / "ad"), str(tmp_path / "peft")
    make_llama_dir(hf_dir, seed=1)
    loss, grads, based, merged, adapters = _losses_and_grads(hf_dir, 1)
    assert based == [] and len(grads) == 2 * 4 * 2  # 2 layers x 4 targets x (A, B)
    torch.testing.assert_close(merged, loss, atol=1e-5, rtol=1e-5)  # merge == unmerged
    ranks = run_distributed(_tp2_and_pp2, 2, args=(hf_dir, ckpt), timeout=240)
    for rank in ranks:
        for run in ("tp2", "tp2_sp"):
            loss2, grads2, based2, merged2, _ = rank[run]
            assert based2 == []
            torch.testing.assert_close(loss2, loss, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(merged2, loss, atol=1e-5, rtol=1e-5)
            assert grads2.keys() == grads.keys()
            for k in grads:
                torch.testing.assert_close(grads2[k], grads[k], atol=1e-5, rtol=1e-4, msg=k)
        for run in ("pp2_adapters", "tp2_loaded"):
            assert rank[run].keys() == adapters.keys() - {"logits"}, run
            for k in rank[run]:
                torch.testing.assert_close(rank[run][k], adapters[k], atol=0, rtol=0)

    peft = pytest.importorskip("peft")
    from gigatron.training.peft.adapter_io import export_peft, read_adapters

    state, lora = read_adapters(ckpt)
    export_peft(state, lora, hf_dir, peft_dir)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    ids, labels = _batch()
    with torch.no_grad():
        base_logits = hf(input_ids=ids).logits
        logits = peft.PeftModel.from_pretrained(hf, peft_dir).eval()(input_ids=ids).logits
    torch.testing.assert_close(logits, adapters["logits"], atol=1e-5, rtol=1e-5)
    assert (logits - base_logits).abs().max() > 1e-3  # the adapters changed the output
