"""Filters of the model catalog; the logic is in plugin_utils/models/catalog.py."""

from ansible_collections.prima.cluster.plugins.plugin_utils.models.catalog import (
    model_selection_problems, catalog_problems_detailed, digest_conflicts, disk_problem, fact_entries, hub_query,
    lock_problems, lock_updates, parse_lock, merged_catalog, models_files, models_selection, with_hub_metadata)


class FilterModule:
    def filters(self):
        return {
            "model_selection_problems": model_selection_problems,
            "models_merged_catalog": merged_catalog,
            "models_selection": models_selection,
            "models_files": models_files,
            "models_catalog_problems": catalog_problems_detailed,
            "models_lock_updates": lock_updates,
            "models_lock_problems": lock_problems,
            "models_parse_lock": parse_lock,
            "models_hub_query": hub_query,
            "models_with_hub_metadata": with_hub_metadata,
            "models_digest_conflicts": digest_conflicts,
            "models_fact_entries": fact_entries,
            "models_disk_problem": disk_problem,
        }
