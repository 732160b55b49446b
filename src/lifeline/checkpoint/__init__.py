"""The universal checkpoint format: save any parallel layout, load into any other.

A checkpoint is one blob per rank plus a versioned manifest written last (the commit
marker). See ``docs/checkpoint.md`` for the API, the byte format and the protocol.

Names are imported lazily (PEP 562) so that ``lifeline.checkpoint.cli`` — and with it
``lifeline --help`` — does not import torch.
"""

from __future__ import annotations

from lifeline._lazy import exports

_EXPORTS: dict[str, str] = {}
for _module, _names in {
    "_layout": ["Layout", "RankCoords"],
    "_patterns": ["Pattern", "Replicated", "Sharded", "SubParams", "Padded", "Expert", "Zero1", "Placed"],
    "_rules": ["PatternRules"],
    "_shard_plan": ["ALIGN", "ShardPlan", "plan_shard", "shard_buffers", "write_shard"],
    "_shard_metadata": ["DEFAULT_BLOCK_SIZE", "seal_shard", "seal_entries", "choose_block_size", "ShardMetadata",
                  "TensorMeta", "ChunkMeta", "BytesMeta"],
    "_manifest": ["FORMAT_VERSION", "Manifest", "TensorRecord", "ChunkRef"],
    "_storage": ["Storage", "SupportsSize", "SupportsGetInto", "SupportsGetPiecesInto", "SupportsPutStream",
                 "SupportsPutUnsized", "SupportsUploader", "Uploader", "ReadTuning"],
    "_backends": ["FilesystemStorage", "MemoryStorage"],
    "_resolve": ["StorageOptions", "SCHEMES", "storage_from_uri", "uri_scheme"],
    "_crc": ["crc32c", "crc32c_blocks"],
    "_s3": ["S3Storage"],
    "_azure": ["AzureStorage"],
    "_gcs": ["GCSStorage"],
    "_readers": ["BlobReader", "SupportsReadInto", "SupportsReadPiecesInto", "StorageBlobReader"],
    "_loader": ["LoadReport", "execute_load"],
    "_load_plan": ["LoadPlan", "plan_load"],
    "_keys": ["step_prefix", "blob_key", "manifest_key"],
    "_checkpoint": ["save_blob", "persist_shard", "persist_state", "commit", "save", "save_states", "list_steps",
                    "read_manifest", "load_shard", "load", "consolidate", "delete_step", "verify_checkpoint"],
    "_blob": ["read_shard"],
    "_slot": ["SlotRecord", "OperatorMembers", "slot_entries", "slot_record", "pack_slot", "unpack_slot"],
    "_window_store": ["SlotCopy", "WindowManifest", "window_slot_key", "window_manifest_key", "commit_window",
                      "read_window_manifest", "read_window_slot", "window_starts", "delete_window"],
    "_shard": ["shard_state", "local_shape"],
    "_window": ["ACTIVE_BYTES_PER_PARAM", "Operator", "SlotCost", "WindowSchedule", "agree_window", "budget_bytes",
                "needs_replan", "plan_window", "with_window"],
    "_state": ["Stateful", "pack_rng_state", "restore_rng_state", "stateful_entries", "load_stateful"],
}.items():
    for _name in _names:
        _EXPORTS[_name] = _module

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = exports(__name__, _EXPORTS)
