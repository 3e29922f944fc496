"""The image service's series on /metrics (amity's own names: Friendli publishes none
for images). Queue time and latency go to the shared `friendli_requests_queueing_delays`
and `friendli_requests_latencies` through each request's tracker."""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from amity.images.service import ImageStats


class ImageMetrics:
    def __init__(self, stats: ImageStats):
        self.stats = stats

    def collect(self):
        st = self.stats
        yield CounterMetricFamily("amity_images_generated", "Images generated and delivered.",
                                  value=st.images_generated)
        yield CounterMetricFamily("amity_image_steps", "Denoising steps, counted per image.",
                                  value=st.image_steps)
        yield CounterMetricFamily("amity_image_batches", "Pipeline runs (batches of images).",
                                  value=st.batches)
        yield GaugeMetricFamily("amity_images_running", "Images in the pipeline run now.",
                                value=st.running)
        yield GaugeMetricFamily("amity_image_steps_per_second",
                                "Denoising steps per second (per image) of the latest batch.",
                                value=st.steps_per_second)
