"""What the pod-side scripts share (shipped inside each script's artifact that imports it)."""
