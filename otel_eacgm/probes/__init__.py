"""Probe catalog, library and symbol resolution, process discovery."""
