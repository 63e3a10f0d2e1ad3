"""Data, below every other layer but the runtime: records (the RecordIO layout and
its checks), faces (reading and decoding one image), iterators (what the trainer
reads), folders (a folder of images per identity, and its index), synthetic_set
(the generated face set) and synthetic_ijb (an IJB-layout set of it). The
commands pack (a folder into a .rec), check (a .rec in one pass) and synthetic
(write the synthetic set) live here too.
"""
