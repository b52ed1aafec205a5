"""ElasticSampler: Horovod's sampler that re-splits an epoch's unprocessed samples over
a changed world, counting progress so that no sample of an epoch is lost and none is
repeated beyond the padding of the last batch.

The bookkeeping. An epoch's order is a fixed permutation of the dataset (shuffled with
seed + epoch, the same on every rank). What the job has processed of the epoch is
`offset` samples of that order, plus `extra` indices recorded one by one with
record_indices. At a reset the unprocessed rest (the *segment*) is padded to a
multiple of size() with its own first samples and dealt out round-robin: rank r gets
positions r, r + n, r + 2n ... So batch b of every rank together covers positions
[b*bs*n, (b+1)*bs*n) of the segment, and the first k batches of all ranks are a
*prefix* of it: k calls of ``record_batch(_, bs)`` since the pass began, on any rank,
record the whole job's progress, min(k*bs*n, len(segment)) samples, without
communication. That count, not a
set of indices, is what a commit saves (folded into `offset`), and it is what every
rank has processed when every rank recorded the same batches, which lock-step training
guarantees (a commit takes the smallest count of all ranks, in case one is behind).

Horovod lost samples (horovod#3143: each rank recorded only its own indices and rank 0's
set was broadcast) and repeated them (horovod#3399: the count ran on across a re-split
and through the padding); here the count is global, clipped to the segment, and
restarts with each segment.
"""
import math
import random

import torch.utils.data

import elasticrun as _er

__all__ = ["ElasticSampler"]


class ElasticSampler(torch.utils.data.Sampler):
    """Partitions `dataset` over the ranks like DistributedSampler, and re-partitions
    the unprocessed rest of the epoch after every reset when kept in a TorchState.

    Use: keep it in the TorchState; after each batch call
    ``record_batch(batch_idx, batch_size)`` (batch_size is the per-rank batch size of the
    DataLoader, which must iterate the sampler in order, without drop_last; each call
    counts one more batch of every rank since the pass began, as in Horovod, whatever
    batch_idx says: a running counter such as state.batch is fine); commit.
    set_epoch(e) for a new epoch starts it afresh (at the start or the end of an epoch:
    set_epoch to the epoch already current keeps its progress). Without set_epoch, a new
    pass after one that finished the epoch goes over it again (same order), as
    DistributedSampler and Horovod's sampler do; after a reset, an epoch the job finished
    yields nothing (its samples were all processed). Requires init()."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._offset = 0          # samples of the epoch's order processed before the segment
        self._extra = set()       # indices past `offset` processed (record_indices)
        self._segment_done = 0    # prefix of the segment processed by the whole job
        self._pending = set()     # this rank's record_indices since the last commit
        self._recorded = 0        # record_batch calls since the segment began
        self._pass_begun = False  # a pass over a non-empty segment began here since the last load
        self._order_cache = None
        self.num_replicas = 1
        self.rank = 0
        self.remaining_indices = []
        self.num_samples = 0
        self.total_size = 0
        self.indices = []
        self.reset()

    def _order(self):
        if self._order_cache is None or self._order_cache[0] != self.epoch:
            order = list(range(len(self.dataset)))
            if self.shuffle:
                random.Random(self.seed + self.epoch).shuffle(order)
            self._order_cache = (self.epoch, order)
        return self._order_cache[1]

    def _folded(self):
        """(offset, extra) with the segment's processed prefix folded in."""
        if not self._extra:  # the segment is order[offset:], its prefix the next samples
            return self._offset + self._segment_done, set()
        offset, extra = self._offset, set(self._extra)
        extra.update(self.remaining_indices[:self._segment_done])
        order = self._order()
        while offset < len(order) and order[offset] in extra:
            offset += 1
        behind = set(order[:offset])
        return offset, {i for i in extra if i not in behind}

    def reset(self):
        """Re-splits the unprocessed samples of the epoch over the current world (size()
        and rank() now); progress recorded so far is kept."""
        self._offset, self._extra = self._folded()
        self._segment_done = 0
        self._recorded = 0
        self.num_replicas = _er.size()
        self.rank = _er.rank()
        self.remaining_indices = [i for i in self._order()[self._offset:] if i not in self._extra]
        self.num_samples = int(math.ceil(len(self.remaining_indices) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def set_epoch(self, epoch):
        """Starts `epoch` with nothing processed; the current epoch keeps its progress."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._offset, self._extra, self._segment_done, self._pending = 0, set(), 0, set()
        self._pass_begun = False
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records one more batch of the current pass done on every rank (each rank's
        batches hold `batch_size` samples). batch_idx is not used (Horovod's is not
        either): a counter that runs on across resets, as scripts pass, would otherwise
        mark samples done that no rank saw."""
        self._recorded += 1
        done = min(self._recorded * batch_size * self.num_replicas, len(self.remaining_indices))
        self._segment_done = max(self._segment_done, done)

    def record_indices(self, indices):
        """Records dataset indices this rank processed; the ranks' records are merged
        (gathered) at the next commit of the TorchState that holds the sampler."""
        self._pending.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """This rank's indices of batch `batch_idx` of the current iteration."""
        return self.indices[batch_idx * batch_size:(batch_idx + 1) * batch_size]

    def _merge(self, segment_done, indices):
        """Takes the job-wide record: the smallest prefix of all ranks and the union of
        their record_indices (see SamplerStateHandler)."""
        self._segment_done = segment_done
        self._extra.update(indices)
        self._pending = set()

    def state_dict(self):
        """The progress of the epoch (this rank's record_indices not yet committed are
        not in it)."""
        offset, extra = self._folded()
        return {"epoch": self.epoch, "offset": offset, "extra": sorted(extra)}

    def load_state_dict(self, state_dict):
        """Sets the progress, then re-splits (reset)."""
        self.epoch = state_dict["epoch"]
        self._offset = state_dict["offset"]
        self._extra = set(state_dict["extra"])
        self._segment_done = 0
        self._pending = set()
        self._pass_begun = False
        self.reset()

    def __iter__(self):
        # A new pass starts where the recorded progress ends. One after a pass that
        # finished the epoch in this process (no reset loaded progress since) starts the
        # epoch over, as without set_epoch a DistributedSampler would.
        ran = self._pass_begun
        self.reset()
        if ran and not self.remaining_indices:
            self._offset, self._extra, self._pending = 0, set(), set()
            self.reset()
        indices = self.remaining_indices[:]
        while 0 < len(indices) < self.total_size:  # padding: the segment's first samples again
            indices += indices[:self.total_size - len(indices)]
        self.indices = indices[self.rank:self.total_size:self.num_replicas]
        self._pass_begun = bool(self.remaining_indices)
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
