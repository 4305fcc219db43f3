"""The docs UI at /schema works offline: the page and every asset it loads come from this server."""

import re


def test_docs_page_and_assets_are_served_locally(client):
    page = client.get("/schema")
    assert page.status_code == 200 and "swagger" in page.text.lower()
    assets = re.findall(r"""(?:src|href)=['"]([^'"]+)['"]""", page.text)
    assert assets, page.text
    assert not [url for url in assets if url.startswith(("http:", "https:", "//"))]
    for url in assets:
        assert client.get(url).status_code == 200, url
    assert "createChatCompletion" in page.text  # the page carries the spec


def test_served_openapi_document_is_the_spec(client):
    from choir.plugins.spec import load_spec

    schema = client.get("/schema/openapi.json")
    assert schema.status_code == 200 and schema.json() == load_spec()
