"""Copy a model's weights into its S3 prefix, verify them, and record a manifest (the import Job).

The entry point is `__main__` (`python3 <folder>/weights_import.pyz`); the work is in `main`."""
