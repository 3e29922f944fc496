"""A small corpus with known answers: five documents, each a few paragraphs on one
subject (so several chunks each), and twenty questions in other words than the text,
each with a phrase that only the passage answering it contains."""

DOCUMENTS = {
    "astronomy.md": """# Notes on the solar system

Mars is a cold desert world with a thin atmosphere of carbon dioxide. It is home to
Olympus Mons, the largest volcano known in the solar system, about three times the
height of Mount Everest. Its red colour comes from iron oxide dust.

Venus spins very slowly and backwards. A single rotation takes 243 Earth days, longer
than its year. Its thick clouds of sulphuric acid trap heat, so its surface is hotter
than that of Mercury.

Saturn is a gas giant famous for its bright rings. The rings are made mostly of chunks
of ice and rock, from grains of dust to boulders the size of houses, orbiting in a
sheet only tens of metres thick.

Jupiter has dozens of moons. Europa, one of the four large Galilean moons, is covered
by a shell of ice, and beneath it there is probably a salty liquid ocean that could
hold more water than all of Earth's seas.
""",
    "cooking.txt": """Fresh pasta needs only flour and eggs. Knead the dough until it is smooth
and elastic, then wrap it and let it rest for thirty minutes so the gluten relaxes
before you roll it out thinly.

A crusty sourdough loaf bakes best in a very hot oven. Preheat a cast iron pot at 250
degrees Celsius, bake the loaf covered for twenty minutes to trap steam, then uncover
it to brown the crust.

Paella is a rice dish from Valencia. Its golden yellow colour and floral aroma come
from saffron, the dried stigmas of the crocus flower, which is among the most
expensive spices in the world.

Mashed avocado oxidises quickly once exposed to the air. Stirring in plenty of lime
juice and pressing plastic wrap onto the surface of the guacamole keeps it green for
hours.
""",
    "history.md": """# A few turning points

The Berlin Wall divided the city for almost three decades. On the night of 9 November
1989 the border crossings were opened and crowds began to tear the wall down, a year
before German reunification.

After the civil wars of the late Republic, Octavian became the sole ruler of Rome. In
27 BC the Senate gave him the name Augustus, and he is counted as the first Roman
emperor.

Around 1450 Johannes Gutenberg built a printing press in Mainz that used movable type
cast from metal. Books could now be produced far faster and more cheaply than by hand
copying.

In 1215 King John of England met his rebellious barons in a meadow at Runnymede beside
the Thames and sealed the Magna Carta, which limited the power of the king.
""",
    "programming.txt": """A hash table stores values under keys and finds a key's value in constant
time on average, by hashing the key to a bucket. Dictionaries in Python are hash
tables.

Version control systems record every change to a project's files. Git, written by
Linus Torvalds in 2005, keeps the whole history in each clone and makes branching and
merging cheap.

A race condition happens when two threads access shared data at the same time and the
result depends on which one runs first. Locks and other synchronisation primitives
prevent it.

Garbage collection automatically reclaims memory that a program can no longer reach,
so programmers do not have to free objects by hand. Java and Python both use a garbage
collector.
""",
    "biology.md": """# The living cell and the body

Mitochondria are the powerhouses of the cell: they break down sugars and fats and make
most of the cell's energy in the form of ATP. They carry their own small genome.

Photosynthesis in the chloroplasts of green plants uses the energy of sunlight to turn
carbon dioxide and water into glucose, releasing oxygen as a by-product.

Red blood cells are packed with haemoglobin, an iron-containing protein that binds
oxygen in the lungs and releases it in the tissues.

The human heart has four chambers: two atria receive blood and two ventricles pump it
out, to the lungs on the right side and to the rest of the body on the left.
""",
}

# (question, a phrase only the passage that answers it contains)
QUESTIONS = [
    ("Which planet has the biggest volcano?", "Olympus Mons"),
    ("How long does one turn of Venus on its axis take?", "243 Earth days"),
    ("What are the rings around Saturn made of?", "ice and rock"),
    ("Which of Jupiter's moons might have water under its frozen surface?", "Europa"),
    ("How long should I leave homemade noodle dough before rolling it?", "thirty minutes"),
    ("At what temperature should I bake bread?", "250"),
    ("Which spice makes the Spanish rice dish yellow?", "saffron"),
    ("How do I stop avocado dip from turning brown?", "lime"),
    ("When was the wall in Berlin torn down?", "1989"),
    ("Who was the first emperor of ancient Rome?", "Augustus"),
    ("What invention made books cheap in the fifteenth century?", "movable type"),
    ("Where was the Magna Carta agreed?", "Runnymede"),
    ("Which data structure looks up a key in constant time?", "hash table"),
    ("What software tracks the history of changes to source code?", "Git"),
    ("What goes wrong when threads touch shared data without locking?", "race condition"),
    ("How do languages free memory that is no longer used?", "Garbage collection"),
    ("Which part of the cell produces energy?", "Mitochondria"),
    ("How do plants make sugar from light?", "Photosynthesis"),
    ("What protein carries oxygen in red blood cells?", "haemoglobin"),
    ("How many chambers does a human heart have?", "four chambers"),
]
