"""Drafter trainers: their rules (`rules/trainers/*.toml`), preprocessing reimplemented, own code run."""
