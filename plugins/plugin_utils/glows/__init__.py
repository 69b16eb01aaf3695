"""Glows: the SDK API client, its instances as inventory hosts, renting and releasing them."""
