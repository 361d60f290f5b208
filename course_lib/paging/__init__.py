"""Module 01's memory systems: two KV allocators driven by one request trace, and
block tables with reference counts and copy-on-write."""
