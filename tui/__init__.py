"""The `dflashctl watch` Textual dashboard."""
