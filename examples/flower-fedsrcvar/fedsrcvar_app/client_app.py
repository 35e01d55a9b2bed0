"""The ClientApp: fedfair's local FedSRCVaR steps on the site's own rows of Adult."""

from fedfair.flower import client_app
from fedsrcvar_app.task import model, site_rows

app = client_app(model, site_rows)
