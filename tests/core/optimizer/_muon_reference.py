"""Muon and Lion written from the definition of NVIDIA's `emerging_optimizers` 0.3.0 (the package
Megatron calls; it needs Python >= 3.12, so the tests carry this plain transcription instead):
`muon_utils.newton_schulz`, `Muon` / `OrthogonalizedOptimizer.step`, `get_muon_scale_factor`,
`Lion.step` and `calculate_lion_update`. One matrix at a time, no process groups."""

import torch

# emerging_optimizers.orthogonalized_optimizers.muon_utils._COEFFICIENT_SETS
QUINTIC = [
    (4.0848, -6.8946, 2.9270),
    (3.9505, -6.3029, 2.6377),
    (3.7418, -5.5913, 2.3037),
    (2.8769, -3.1427, 1.2046),
    (2.8366, -3.0525, 1.2012),
]
SIMPLE = [(3.4445, -4.7750, 2.0315)]
POLAR_EXPRESS = [
    (8.2051, -22.9019, 16.4607),
    (4.0664, -2.8612, 0.5184),
    (3.9096, -2.8234, 0.5250),
    (3.2856, -2.4153, 0.4853),
    (2.2779, -1.6198, 0.3985),
    (1.8726, -1.2307, 0.3585),
    (1.8564, -1.2132, 0.3568),
    (1.8750, -1.2500, 0.3750),
]
COEFFS = {"quintic": (QUINTIC, "cycle"), "simple": (SIMPLE, "cycle")}
COEFFS["polar_express"] = (POLAR_EXPRESS, "repeat_last")


def coefficients(kind: str, steps: int) -> list:
    sets, mode = COEFFS[kind]
    out = []
    for i in range(steps):
        out.append(sets[i % len(sets)] if mode == "cycle" else sets[min(i, len(sets) - 1)])
    return out


def newton_schulz(g: torch.Tensor, steps: int = 5, kind: str = "quintic", medium=False):
    """The zeroth power of `g` by the quintic iteration on the smaller side."""
    x = g.T if g.shape[0] > g.shape[1] else g
    x = x / torch.linalg.matrix_norm(x).clamp_min(1e-7)
    if medium:
        x = x.bfloat16()
    for a, b, c in coefficients(kind, steps):  # a x + (b A + c A A) x, as the package's addmm
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    x = x.float()
    return x.T if g.shape[0] > g.shape[1] else x


def scale(out: int, inp: int, mode: str = "spectral") -> float:
    return {
        "spectral": max(out, inp) ** 0.5,
        "unit_rms_norm": (out / inp) ** 0.5,
        "shape_scaling": max(1, out / inp) ** 0.5,
    }[mode]


def muon_step(w, g, buf, *, lr, wd, momentum, nesterov=False, mode="spectral", extra=1.0, **ns):
    """(new weight, new momentum buffer): decoupled decay, EMA momentum, scaled NS update."""
    w = w * (1 - lr * wd)
    buf = momentum * buf + (1 - momentum) * g
    u = (1 - momentum) * g + momentum * buf if nesterov else buf
    return w - lr * extra * scale(*w.shape, mode) * newton_schulz(u, **ns), buf


def muon_qkv_update(u, shapes, **ns):
    """Scaled NS of the Q, K and V rows of fused QKV `u` [ng * sum(shapes), h], separately."""
    ng, h = u.shape[0] // sum(shapes), u.shape[1]
    parts = torch.split(u.view(ng, sum(shapes), h), shapes, dim=1)
    outs = []
    for part in parts:
        m = part.reshape(-1, h)
        outs.append((scale(*m.shape) * newton_schulz(m, **ns)).view(ng, -1, h))
    return torch.cat(outs, dim=1).view(u.shape)


def lion_step(w, g, m, *, lr, wd, beta1, beta2):
    """(new weight, new momentum): decoupled decay, sign of the beta1 mix, beta2 EMA."""
    w = w * (1 - lr * wd)
    update = torch.sign(beta1 * m + (1 - beta1) * g)
    return w - lr * update, beta2 * m + (1 - beta2) * g
