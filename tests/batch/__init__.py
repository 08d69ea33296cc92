# A manifest record's fields: those DESIGN 7 pins, then ours.
MANIFEST_FIELDS = {"line", "task_id", "status", "files", "error"} | {
    "id",
    "surface",
    "prompt",
    "aspect_ratio",
    "resolution",
    "cost",
    "credits",
    "expires_at",
}
