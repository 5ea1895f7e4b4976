"""The demo pipeline end to end on the embedded sample."""
