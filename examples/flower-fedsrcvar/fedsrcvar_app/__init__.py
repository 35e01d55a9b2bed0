"""FedSRCVaR on Adult by race as a Flower App."""
