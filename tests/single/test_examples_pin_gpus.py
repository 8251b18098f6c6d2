"""Every example that calls hvd.init() pins its process to the GPU of its
local rank and lets TensorFlow grow GPU memory, right after hvd.init() (as
Horovod's examples do): without it every rank of a host takes GPU 0 and NCCL
refuses the job, or TensorFlow's memory grab leaves NCCL nothing."""

import glob
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INIT = re.compile(r"^(\s*)hvd\.init\(\)", re.M)


def examples():
    return sorted(glob.glob(os.path.join(ROOT, "examples", "*.py")))


def test_every_example_pins_its_gpu_after_init():
    checked = 0
    for path in examples():
        src = open(path).read()
        for m in INIT.finditer(src):
            after = src[m.end():].split("\n")[1:9]
            body = "\n".join(after)
            name = os.path.basename(path)
            assert "set_memory_growth(gpu, True)" in body, (name, body)
            assert re.search(r"set_visible_devices\(gpus\[hvd\.local_rank\(\)\], \"GPU\"\)",
                             body), (name, body)
            checked += 1
    assert checked >= 10, checked


def test_the_readme_diff_pins_too():
    readme = open(os.path.join(ROOT, "README.md")).read()
    diff = readme[readme.index("```diff"):]
    diff = diff[:diff.index("```", 7)]
    assert "+    tf.config.set_visible_devices(gpus[hvd.local_rank()], \"GPU\")" in diff
    assert "+    tf.config.experimental.set_memory_growth(gpu, True)" in diff
