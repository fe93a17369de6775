"""Stage one model version's weights on this node's NVMe, and say so with a node label.

The entry point is `__main__` (`python3 <folder>/weights_stage.pyz`); the work is in `main`."""
