"""Data: the RecordIO layout, iterators, the synthetic set and the packing tool."""
