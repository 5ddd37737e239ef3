"""Import streams: the anonymous memory a conversion needs does not grow with the model.

Two Llama-shaped safetensors models (4 and 16 layers, 46 MB and 172 MB of fp32 weights, written
with random values by gigatron's own writer) are converted in fresh processes while a thread
samples RssAnon (process memory that is not file-backed page cache). Memory-mapped inputs and
the memory-mapped scratch file do not count; a converter that held the model would need 126 MB
more for the larger one.
"""

import json
import subprocess
import sys

import pytest

_PROBE = r"""
import json, os, sys, threading, time
import torch
import gigatron.convert
import gigatron.core.dist_checkpointing
import gigatron.training.checkpointing
from gigatron.convert.hf_io import iter_planned, write_safetensors

L, H, F, V = int(sys.argv[1]), 512, 1024, 1000
src, out = sys.argv[2], sys.argv[3]
os.makedirs(src)
cfg = dict(model_type="llama", num_hidden_layers=L, hidden_size=H, intermediate_size=F,
           num_attention_heads=8, num_key_value_heads=8, vocab_size=V,
           max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)
json.dump(cfg, open(os.path.join(src, "config.json"), "w"))
shapes = {"model.embed_tokens.weight": (V, H), "lm_head.weight": (V, H), "model.norm.weight": (H,)}
for i in range(L):
    p = f"model.layers.{i}."
    shapes.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                   p + "mlp.gate_proj.weight": (F, H), p + "mlp.up_proj.weight": (F, H),
                   p + "mlp.down_proj.weight": (H, F)})
    shapes.update({p + f"self_attn.{n}_proj.weight": (H, H) for n in "qkvo"})
plan = [(n, s, torch.float32) for n, s in shapes.items()]
write_safetensors(src, plan, iter_planned(plan, lambda n: torch.randn(shapes[n])))

def anon():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("RssAnon"))

peak, done = [0], [False]
def sample():
    while not done[0]:
        peak[0] = max(peak[0], anon())
        time.sleep(0.002)
base = anon()
t = threading.Thread(target=sample)
t.start()
gigatron.convert.convert_hf_to_gigatron(src, out)
done[0] = True
t.join()
print(json.dumps({"bytes": sum(torch.Size(s).numel() * 4 for s in shapes.values()),
                  "growth": peak[0] - base}))
"""


def _convert_and_measure(num_layers: int, tmp_path) -> dict:
    root = tmp_path / f"l{num_layers}"
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", _PROBE, str(num_layers), str(root / "hf"),
         str(root / "gt")],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_import_memory_does_not_grow_with_model_size(tmp_path):
    small, large = _convert_and_measure(4, tmp_path), _convert_and_measure(16, tmp_path)
    extra_model = large["bytes"] - small["bytes"]  # 126 MB
    extra_memory = large["growth"] - small["growth"]
    print(f"anonymous peak growth: {small['growth'] / 2**20:.1f} MiB for "
          f"{small['bytes'] / 2**20:.0f} MiB, {large['growth'] / 2**20:.1f} MiB for "
          f"{large['bytes'] / 2**20:.0f} MiB")  # fmt: skip
    assert extra_memory < 0.4 * extra_model  # holding the model would need >= 1.0 x
    assert large["growth"] < 0.6 * large["bytes"]
