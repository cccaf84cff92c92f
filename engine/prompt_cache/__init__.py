"""The prompt-cache pool: KV prefixes kept beyond the slots, in RAM and on disk.

    blocks.py  a Block (positions' keys and their K/V rows) and the chain hash that names it
    pool.py    PromptCachePool: a model's blocks as a tree of prefixes, bounded in bytes; what a
               slot takes at admission and gives before it is overwritten
    disk.py    DiskStore: blocks as files (atomic writes, fingerprint-checked, mmap'd back)
    slot_file.py  one slot's whole content as a file (llama.cpp's /slots save and restore)
"""
from .blocks import BLOCK, Block, chain_hash
from .disk import DiskStore
from .pool import Lookup, PromptCachePool, poolable
from .slot_file import SlotFileError, restore_slot, save_slot

__all__ = ["BLOCK", "Block", "DiskStore", "Lookup", "PromptCachePool", "SlotFileError",
           "chain_hash", "poolable", "restore_slot", "save_slot"]
