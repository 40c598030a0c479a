"""JADE (Cardoso & Souloumiac, 1993): blind source separation by joint approximate
diagonalization of fourth-order cumulant matrices, in numpy.

Model: `X = A·S` with `S` independent non-Gaussian rows. After whitening `z = W·x`, every
cumulant matrix `Q(M)_{kl} = Σ_ij cum(z_k, z_l, z_i, z_j)·M_ij` of the whitened data is
diagonalized by the same rotation; Jacobi (Givens) sweeps find the rotation that makes a
basis of them jointly as diagonal as possible.
"""

import numpy as np


def whiten(x, m):
    """Centers the rows of `x` (signals × samples) and projects on the top `m` principal
    directions with unit variance. Returns (z, W) with z = W·(x − mean)."""
    x = x - x.mean(axis=1, keepdims=True)
    cov = x @ x.T / x.shape[1]
    vals, vecs = np.linalg.eigh(cov)
    order = np.argsort(vals)[::-1][:m]
    vals, vecs = vals[order], vecs[:, order]
    keep = vals > vals[0] * 1e-12
    w = (vecs[:, keep] / np.sqrt(vals[keep])).T
    return w @ x, w


def cumulant_matrices(z):
    """The m(m+1)/2 cumulant matrices Q(e_i e_iᵀ) and Q((e_i e_jᵀ + e_j e_iᵀ)/√2), i < j, of
    whitened `z` (m × T), stacked (K × m × m). For whitened data
    Q(M) = E[(zᵀMz)·z zᵀ] − tr(M)·I − M − Mᵀ."""
    m, t = z.shape
    pairs = (z[:, None, :] * z[None, :, :]).reshape(m * m, t)
    moments = (pairs @ pairs.T / t).reshape(m, m, m, m)  # E[z_i z_j z_k z_l]
    iu, ju = np.triu_indices(m)
    qs = moments[iu, ju].copy()  # E[z_i z_j z zᵀ] for i ≤ j
    diag = iu == ju
    qs[diag] -= np.eye(m)
    qs[diag, iu[diag], iu[diag]] -= 2.0
    off = ~diag
    qs[off] *= np.sqrt(2.0)
    qs[off, iu[off], ju[off]] -= np.sqrt(2.0)
    qs[off, ju[off], iu[off]] -= np.sqrt(2.0)
    return qs


def _rounds(m):
    """Round-robin schedule: m−1 (or m) rounds of disjoint pairs covering every pair once."""
    idx = list(range(m)) + ([None] if m % 2 else [])
    size = len(idx)
    out = []
    for _ in range(size - 1):
        pairs = [(idx[i], idx[size - 1 - i]) for i in range(size // 2)]
        out.append(np.array([sorted(p) for p in pairs if None not in p], dtype=int).reshape(-1, 2))
        idx = [idx[0]] + [idx[-1]] + idx[1:-1]
    return out


def joint_diagonalize(qs, sweeps=100, tol=1e-6):
    """Orthogonal V that jointly diagonalizes the symmetric matrices `qs` (K × m × m):
    VᵀQ_kV is as diagonal as possible for every k. Jacobi sweeps in parallel order: each
    round rotates disjoint pairs (p, q) at once, by the angle that maximizes the diagonal
    energy Σ_k (Q_k[p,p]² + Q_k[q,q]²)."""
    qs = qs.copy()
    m = qs.shape[1]
    v = np.eye(m)
    schedule = _rounds(m)
    for _ in range(sweeps):
        largest = 0.0
        for pairs in schedule:
            if len(pairs) == 0:
                continue
            p, q = pairs[:, 0], pairs[:, 1]
            g1 = qs[:, p, p] - qs[:, q, q]
            g2 = qs[:, p, q] + qs[:, q, p]
            ton = (g1 * g1).sum(0) - (g2 * g2).sum(0)
            toff = 2.0 * (g1 * g2).sum(0)
            theta = 0.5 * np.arctan2(toff, ton + np.hypot(ton, toff))
            c, s = np.cos(theta), np.sin(theta)
            largest = max(largest, float(np.abs(s).max()))
            g = np.eye(m)
            g[p, p], g[q, q], g[q, p], g[p, q] = c, c, s, -s
            v = v @ g
            qs = g.T @ qs @ g
        if largest <= tol:
            break
    return v


def eigenmatrices(qs):
    """Cardoso's reduction: the cumulant tensor restricted to symmetric matrices has only
    m significant eigenmatrices; diagonalizing those (scaled by their eigenvalues) is
    equivalent and m(m+1)/2 / m times cheaper than the full set."""
    k, m, _ = qs.shape
    basis = np.zeros((k, m, m))
    a = 0
    for i in range(m):
        basis[a, i, i] = 1.0
        a += 1
        for j in range(i + 1, m):
            basis[a, i, j] = basis[a, j, i] = np.sqrt(0.5)
            a += 1
    flat_q, flat_b = qs.reshape(k, -1), basis.reshape(k, -1)
    t = flat_b @ flat_q.T
    vals, vecs = np.linalg.eigh((t + t.T) / 2)
    top = np.argsort(-np.abs(vals))[:m]
    return (vecs[:, top].T @ flat_q).reshape(len(top), m, m)


def jade(x, m=None):
    """Estimated sources (m × samples) of the mixture `x` (signals × samples)."""
    m = m or x.shape[0]
    z, _ = whiten(x, m)
    # Rotations smaller than the estimation noise of the cumulants are skipped (Cardoso).
    v = joint_diagonalize(eigenmatrices(cumulant_matrices(z)), tol=0.01 / np.sqrt(z.shape[1]))
    return v.T @ z
