"""SyncBatchNorm: Horovod's hvd.SyncBatchNorm, batch normalization over the whole job's
batch (every rank's samples), on CPU as well as CUDA tensors.

Training forward: each rank's per-channel count, mean and sum of squared deviations
travel in one allgather and are combined exactly (Chan's parallel formula, no
sum-of-squares cancellation), so ranks may hold different numbers of samples, none
included. Backward: the per-channel sums of dy and dy * x_hat travel in one allreduce
for the input's gradient; the weight's and bias's gradients stay this rank's own, which
DistributedOptimizer then averages like any other gradient (torch.nn.SyncBatchNorm does
the same). In eval mode, or with one worker, it is plain BatchNorm.
"""
import torch
import torch.nn.functional as F

import elasticrun as _er
from elasticrun.torch import ops

__all__ = ["SyncBatchNorm"]


class SyncBatchNorm(torch.nn.modules.batchnorm._BatchNorm):
    """Batch normalization with the statistics of every rank's batch together; the same
    arguments as torch.nn.BatchNorm1d/2d/3d (inputs of 2 or more dimensions, channels
    in dimension 1)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("SyncBatchNorm expects an input of at least 2 dimensions (got %dD)" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # a cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        use_batch = self.training or not self.track_running_stats
        if not use_batch or _er.size() == 1:
            return F.batch_norm(input, self.running_mean if not use_batch or self.track_running_stats else None,
                                self.running_var if not use_batch or self.track_running_stats else None,
                                self.weight, self.bias, use_batch, factor, self.eps)
        return _SyncBatchNormFn.apply(input, self.weight, self.bias,
                                      self.running_mean if self.track_running_stats else None,
                                      self.running_var if self.track_running_stats else None, self.eps, factor)


def _per_channel(t, x):
    """A (C,) tensor shaped to broadcast over x (N, C, ...)."""
    return t.view([1, -1] + [1] * (x.dim() - 2))


class _SyncBatchNormFn(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, factor):
        channels = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        acc = torch.float64 if x.dtype == torch.float64 else torch.float32
        xa = x.to(acc)
        count = x.numel() // channels if channels else 0
        if count:
            mean = xa.mean(dims)
            m2 = ((xa - _per_channel(mean, xa)) ** 2).sum(dims)
        else:
            mean = torch.zeros(channels, dtype=acc, device=x.device)
            m2 = torch.zeros(channels, dtype=acc, device=x.device)
        row = torch.cat([torch.tensor([float(count)], dtype=acc, device=x.device), mean, m2]).unsqueeze(0)
        rows = ops.allgather(row)  # (size, 1 + 2C)
        counts, means, m2s = rows[:, :1], rows[:, 1:1 + channels], rows[:, 1 + channels:]
        total = float(counts.sum())
        if total <= 1:
            raise ValueError("SyncBatchNorm: expected more than 1 value per channel when training "
                             "(the whole job's batch has %d)" % int(total))
        gmean = (counts * means).sum(0) / total
        gm2 = (m2s + counts * (means - gmean) ** 2).sum(0)
        var = gm2 / total
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            running_mean.mul_(1 - factor).add_(gmean.to(running_mean.dtype), alpha=factor)
            running_var.mul_(1 - factor).add_((gm2 / (total - 1)).to(running_var.dtype), alpha=factor)
        xhat = (xa - _per_channel(gmean, xa)) * _per_channel(invstd, xa)
        y = xhat
        if weight is not None:
            y = y * _per_channel(weight.to(acc), xa) + _per_channel(bias.to(acc), xa)
        ctx.save_for_backward(xhat, weight, invstd)
        ctx.total = total
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, weight, invstd = ctx.saved_tensors
        dims = [d for d in range(xhat.dim()) if d != 1]
        channels = xhat.shape[1]
        dya = dy.to(xhat.dtype)
        sum_dy = dya.sum(dims)
        sum_dy_xhat = (dya * xhat).sum(dims)
        both = ops.allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=ops.Sum)
        g_dy, g_dy_xhat = both[:channels], both[channels:]
        scale = invstd if weight is None else invstd * weight.to(xhat.dtype)
        dx = _per_channel(scale, xhat) * (dya - _per_channel(g_dy / ctx.total, xhat) -
                                          xhat * _per_channel(g_dy_xhat / ctx.total, xhat))
        grad_weight = grad_bias = None
        if weight is not None:
            grad_weight = sum_dy_xhat.to(weight.dtype) if ctx.needs_input_grad[1] else None
            grad_bias = sum_dy.to(weight.dtype) if ctx.needs_input_grad[2] else None
        return dx.to(dy.dtype), grad_weight, grad_bias, None, None, None, None
