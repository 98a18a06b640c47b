"""An Orbax item is read a bounded group of arrays at a time (inspection.each_array), and what
restore_item assembles from the groups equals the tree Orbax itself saved."""

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxtrain.checkpoint.formats.orbax import inspection


def _saved_tree(tmp_path):
    rng = np.random.default_rng(0)
    tree = {
        'wte': {'embedding': rng.standard_normal((64, 32)).astype(np.float32)},  # 8 KiB
        'h': [
            {'kernel': rng.standard_normal((32, 32)).astype(np.float32), 'bias': np.zeros(32, np.float32)},
            {'kernel': rng.standard_normal((32, 32)).astype(np.float32), 'bias': np.ones(32, np.float32)},
        ],
        'count': np.int32(7),
    }
    ocp.PyTreeCheckpointer().save((tmp_path / 'step' / 'params').absolute(), tree)
    return tmp_path / 'step', tree


def test_restore_item_reads_in_groups_and_equals_what_orbax_saved(tmp_path, monkeypatch):
    step_dir, tree = _saved_tree(tmp_path)
    monkeypatch.setattr(inspection, 'READ_GROUP_BYTES', 4096)
    read_sizes, restore = [], ocp.PyTreeCheckpointer.restore

    def counting_restore(self, *args, **kwargs):
        restored = restore(self, *args, **kwargs)
        arrays = [leaf for leaf in jax.tree.leaves(restored) if isinstance(leaf, np.ndarray | np.generic)]
        read_sizes.append(sum(a.nbytes for a in arrays))
        return restored

    monkeypatch.setattr(ocp.PyTreeCheckpointer, 'restore', counting_restore)
    restored = inspection.restore_item(step_dir, 'params')

    assert jax.tree.structure(restored) == jax.tree.structure(tree)
    for found, expected in zip(jax.tree.leaves(restored), jax.tree.leaves(tree)):
        np.testing.assert_array_equal(found, expected)
        assert np.asarray(found).dtype == expected.dtype
    # 8 KiB of embedding alone (one array over the budget), then the 4 KiB kernels one each,
    # the biases and the count together: never a whole-item read.
    assert len(read_sizes) >= 3
    assert max(read_sizes) == 64 * 32 * 4
    assert sum(read_sizes) == sum(np.asarray(a).nbytes for a in jax.tree.leaves(tree))
